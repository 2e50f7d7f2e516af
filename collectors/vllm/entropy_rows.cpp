// The tap's CPU entropy reduction, one pass over the logits (built and loaded by native_entropy.py).
//
// Same base-2 shifted algorithm as fused_entropy.entropy_per_row_shifted, but chunk by chunk: each
// chunk of CHUNK logits (8 KB, stays in L1) is read from memory once, its max found, then its
// exp2/sums and its float16 shifted logits computed from L1. The chunks' partial sums are combined
// per row with their maxima (the online-softmax identity), so no pass over the whole row waits for
// the row's max. Why by hand: the compiled form (torch.compile) reads the row three times and sums
// through a helper kept in memory; see native_entropy.py for the figures.
//
// Per row r, with z = (x - m_c) * log2(e) / T_r floored at FLOOR (m_c the chunk's max, T_r the row's
// sampling temperature when inverse_temperature is given, else 1):
//   entropy[r]  = ln S - ln2 * T / S   (nats, >= 0), S = sum 2^z', T = sum 2^z' z', z' = z + shift_c
//   log2_sum[r] = log2 S
//   z_out[r, i] = z (float16), chunk_shift[r, c] = shift_c = (m_c - M) * log2(e) / T_r <= 0 (M the row max)
// so a token's surprisal is ln2 * (log2_sum - max(z_out + chunk_shift, FLOOR)) (native_entropy.py).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));

const int64_t CHUNK = 2048;
const float LOG2_E = 1.4426950408889634f;
const float FLOOR = -125.51446855733981f;  // MASK_FLOOR (-87 nats) in base 2, as the other forms
const float EXP_FLOOR = -125.0f;           // 2^z stays a normal float32 (no subnormal slow path)

inline v16 load(const float* p) { v16 v; memcpy(&v, p, sizeof v); return v; }
inline v16 splat(float a) { return (v16){} + a; }
inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
inline float hmax(v16 v) { float m = v[0]; for (int i = 1; i < 16; i++) m = v[i] > m ? v[i] : m; return m; }
inline float hsum(v16 v) { float s = 0; for (int i = 0; i < 16; i++) s += v[i]; return s; }

// 2^z for z in [EXP_FLOOR, 0]: 2^k by the exponent bits, 2^f for f in [-0.5, 0.5] by Cephes' exp2f
// polynomial (relative error ~2e-7, as libm's).
inline v16 exp2v(v16 z) {
  i16v k = __builtin_convertvector(z - 0.5f, i16v);  // truncates toward 0: rounds z <= 0 to nearest
  v16 f = z - __builtin_convertvector(k, v16);
  v16 p = splat(1.535336188319500e-4f);
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  i16v bits = (k + 127) << 23;
  v16 scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// 16 floats to float16 in one register instruction: GCC's generic conversion splits it into pieces,
// and the memory-destination form is slow on AMD cores.
inline void store_half(_Float16* out, v16 z) {
#if defined(__AVX512F__)
  __m512 v;
  memcpy(&v, &z, sizeof v);
  _mm256_storeu_si256((__m256i*)out, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  __m256 lo, hi;
  memcpy(&lo, &z, sizeof lo);
  memcpy(&hi, (const char*)&z + 32, sizeof hi);
  _mm_storeu_si128((__m128i*)out, _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128((__m128i*)(out + 8), _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
#else
  for (int i = 0; i < 16; i++) out[i] = (_Float16)z[i];
#endif
}

inline float floored(float z) { return z > FLOOR ? z : FLOOR; }

}  // namespace

extern "C" int64_t entropy_rows_chunk() { return CHUNK; }

// logits: rows x vocab float32, row stride `stride` elements, contiguous within a row.
// z_out (rows x vocab) and chunk_shift (rows x ceil(vocab / CHUNK)) may be null: nothing kept.
// inverse_temperature (rows, each > 0) may be null: the entropy at temperature 1.
extern "C" void entropy_rows(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                             float* entropy, float* log2_sum, _Float16* z_out, float* chunk_shift,
                             const float* inverse_temperature) {
  const int64_t chunks = (vocab + CHUNK - 1) / CHUNK;
  float chunk_max[chunks], chunk_s[chunks], chunk_t[chunks];  // a few hundred bytes per row
  for (int64_t r = 0; r < rows; r++) {
    const float* x = logits + r * stride;
    const float scale = inverse_temperature ? LOG2_E * inverse_temperature[r] : LOG2_E;
    _Float16* z_row = z_out ? z_out + r * vocab : nullptr;
    float row_max = -INFINITY;
    for (int64_t c = 0; c < chunks; c++) {
      const int64_t start = c * CHUNK, n = vocab - start < CHUNK ? vocab - start : CHUNK, nv = n / 16 * 16;
      const float* xc = x + start;
      v16 mv = splat(-INFINITY);
      for (int64_t i = 0; i < nv; i += 16) mv = vmax(mv, load(xc + i));
      float m = hmax(mv);
      for (int64_t i = nv; i < n; i++) m = xc[i] > m ? xc[i] : m;
      chunk_max[c] = m;
      row_max = m > row_max ? m : row_max;
      if (m == -INFINITY) {  // a wholly masked chunk adds nothing; its tokens read as floored
        chunk_s[c] = chunk_t[c] = 0.0f;
        if (z_row) for (int64_t i = 0; i < n; i++) z_row[start + i] = (_Float16)FLOOR;
        continue;
      }
      v16 sv = splat(0.0f), tv = splat(0.0f);
      for (int64_t i = 0; i < nv; i += 16) {
        v16 z = vmax((load(xc + i) - m) * scale, splat(FLOOR));
        v16 e = exp2v(vmax(z, splat(EXP_FLOOR)));
        sv += e;
        tv += e * z;
        if (z_row) store_half(z_row + start + i, z);
      }
      float s = hsum(sv), t = hsum(tv);
      for (int64_t i = nv; i < n; i++) {
        float z = floored((xc[i] - m) * scale), e = exp2f(z > EXP_FLOOR ? z : EXP_FLOOR);
        s += e;
        t += e * z;
        if (z_row) z_row[start + i] = (_Float16)z;
      }
      chunk_s[c] = s;
      chunk_t[c] = t;
    }
    // combine the chunks in double: 2^shift rescales each chunk's sums to the row's max
    double s = 0.0, t = 0.0;
    for (int64_t c = 0; c < chunks; c++) {
      double shift = chunk_s[c] == 0.0f ? 0.0 : ((double)chunk_max[c] - (double)row_max) * scale;
      if (shift < FLOOR) shift = FLOOR;
      double w = exp2(shift);
      s += w * chunk_s[c];
      t += w * (chunk_t[c] + shift * chunk_s[c]);
      if (chunk_shift) chunk_shift[r * chunks + c] = (float)shift;
    }
    double h = log(s) - t * (M_LN2 / s);
    entropy[r] = h > 0.0 || h != h ? (float)h : 0.0f;  // NaN stays NaN (nothing left in the row)
    log2_sum[r] = (float)log2(s);
  }
}
