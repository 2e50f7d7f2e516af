"""What kind of answer a question asks for, and whether an answer has that form (English, Chinese).

Cosine similarity of sentence embeddings measures topic, and the hardest off-intent answers are on
topic: "when is my deposit returned?" answered with the deposit's amount, "how do I renew it?"
answered with how long it stays valid. What separates them is the *form* the question asks for
(a time, a quantity, steps, a reason, a yes or no, a place) and whether the answer has it. These
cues are regular expressions, no model: each question form maps to answer cues, and
``form_features`` turns a pair into a few numbers for the learned intent head
(``streams/intent_similarity.py``), which weighs them against the cosine.

The cue lists are general-language knowledge written from the question forms themselves, not
fitted to any labelled set; the head's weights are fitted on ``tests/data/intent/train.jsonl``.
"""

from __future__ import annotations

import re

_I = re.IGNORECASE

# question form -> (question cue, answer cue). A question may ask for more than one form
# ("how long and how much?"); the answer meets a form when its cue occurs anywhere in it.
_NUMBER_EN = r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|hundred|thousand|million|dozen|half|once|twice|single|double|free)\b"
_NUMBER_ZH = r"\d|[一二两三四五六七八九十百千万半]|免费"
_TIME_EN = (r"\b(?:minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|a\.?m\.?|p\.?m\.?|o'clock|noon|midnight|"
            r"morning|afternoon|evening|night|tonight|today|tomorrow|yesterday|weekends?|weekdays?|"
            r"mondays?|tuesdays?|wednesdays?|thursdays?|fridays?|saturdays?|sundays?|january|february|march|april|may|june|"
            r"july|august|september|october|november|december|spring|summer|autumn|fall|winter|season|"
            r"within|until|till|after|before|by the|immediately|right away|instantly|soon|later|annually|yearly|"
            r"monthly|weekly|daily|every|usually takes|as soon as|once)\b|\d+:\d\d")
_TIME_ZH = r"秒|分钟|小时|钟头|[天日周月年号]|星期|礼拜|工作日|[上下中]午|早上|晚上|凌晨|傍晚|夜里|[0-9一二两三四五六七八九十]点|之前|之后|以前|以后|以内|内|期间|立即|立刻|马上|随时|当天|次日|明天|今天|今晚|春|夏|秋|冬|季|每"
_STEPS_EN = (r"(?:^|\n)\s*(?:\d+[.)]|[-*•])\s|\b(?:first|then|next|after that|finally|step|go to|open|click|tap|press|select|choose|"
             r"sign in|log in|fill in|fill out|enter|submit|turn|remove|unplug|plug|install|attach|apply|bring|take|"
             r"put|place|add|use|set|call|contact|visit|ask|mix|wash|rinse|soak|clean|check|make sure|try)\b")
_STEPS_ZH = r"(?:^|\n)\s*(?:\d+[.、)）]|[①②③④⑤⑥⑦⑧⑨])|第[一二三四五六七八九十]步|先|然后|再|接着|之后|最后|点击|点开|进入|打开|选择|填写|登录|提交|上传|携带|带上|拿着|前往|去|找|拨打|联系|申请|办理|关闭|拔掉|插上|安装|取下|拆下|装上|按|用|把|将|放|倒|洗|泡|擦|检查|确认|设置|调|换"
_REASON_EN = r"\b(?:because|due to|caused by|causes?|since|as a result|the reason|reasons?|so that|that's why|comes from|results? from|leads? to|likely|usually|often|tends? to|when|if|means)\b"
_REASON_ZH = r"因为|由于|原因|导致|造成|引起|所以|因此|是因为|可能是|一般是|通常是|往往|容易|如果|当"
_YESNO_EN = r"^\W*(?:yes|yeah|yep|no|nope|not|sure|absolutely|definitely|of course|you can|you can't|you cannot|you should|you shouldn't|you don't|you do|you need|you must|it is|it's|it isn't|it's not|they are|they aren't|there is|there are|only|never|always|generally|usually|depends)\b"
_YESNO_ZH = r"^\W*(?:可以|不可以|能|不能|可|不可|是的|是|不是|对|不对|会|不会|有|没有|需要|不需要|不用|要|不要|行|不行|允许|不允许|应该|不应该|建议|不建议|一般|通常|只|不)"
_PLACE_EN = r"\b(?:at|in|on|inside|outside|near|next to|behind|in front of|floor|counter|desk|office|room|building|entrance|lobby|website|site|app|online|page|menu|tab|store|shop|station|center|centre|left|right|upstairs|downstairs|corner)\b"
_PLACE_ZH = r"在|于|到|楼|层|室|厅|窗口|柜台|前台|门口|大厅|网站|官网|小程序|页面|菜单|[Aa][Pp][Pp]|店|中心|站|附近|旁边|对面|左|右|东|西|南|北"

_FORMS: dict[str, tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]] = {
    # form: (English question cue, Chinese question cue, English answer cue, Chinese answer cue)
    "time": (
        re.compile(r"\b(?:when|what time|how long|how soon|how often|what day|which day|what date|by when|deadline|how late|how early|until when)\b", _I),
        re.compile(r"什么时候|啥时候|何时|几点|几号|哪天|哪一天|多久|多长时间|多长|期限|截止|多少天|几天|几年|几个月|多少年"),
        re.compile(_TIME_EN, _I), re.compile(_TIME_ZH),
    ),
    "quantity": (
        re.compile(r"\b(?:how much|how many|how far|how big|how large|how heavy|how tall|how old|how fast|what percentage|"
                   r"what size|cost|price|what(?:'s| is| are) (?:the |my |your |our )?(?:\w+ ){0,3}(?:prices?|costs?|fees?|rates?|"
                   r"amount|total|balance|limits?|size|maximum|minimum|number|percentage))\b", _I),
        re.compile(r"多少|几个|几次|几岁|几天|几年|几号|几点|几码|多大|多远|多重|多高|多长|多快|价格|费用|收费|价钱|多贵|上限|下限|尺码"),
        re.compile(_NUMBER_EN, _I), re.compile(_NUMBER_ZH),
    ),
    "steps": (
        re.compile(r"\b(?:how (?:do|can|should|would) (?:i|we|you)|how to|how does one|what(?:'s| is) the (?:best )?way to|what steps|steps to|what should i do|what do i do|what can i do|how (?:do|can) i get)\b", _I),
        re.compile(r"怎么|怎样|如何|咋|步骤|流程|方法|办法|该怎|要怎|怎么办|怎么弄|怎么做"),
        re.compile(_STEPS_EN, _I), re.compile(_STEPS_ZH),
    ),
    "reason": (
        re.compile(r"\b(?:why|what causes|what caused|how come|what(?:'s| is) the reason|reason for)\b", _I),
        re.compile(r"为什么|为啥|为何|原因|怎么会|咋会|怎么老|怎么总|干嘛"),
        re.compile(_REASON_EN, _I), re.compile(_REASON_ZH),
    ),
    "yesno": (
        re.compile(r"^\W*(?:can|could|is|are|do|does|did|should|will|would|may|am|was|were|has|have|must|shall)\b", _I),
        re.compile(r"吗[？?。！!\s]*$|能不能|可不可以|是不是|有没有|会不会|要不要|需不需要|用不用|行不行|可否|能否|是否"),
        re.compile(_YESNO_EN, _I), re.compile(_YESNO_ZH),
    ),
    "place": (
        re.compile(r"\bwhere\b|\bwhich (?:place|store|office|counter|website|floor)\b", _I),
        re.compile(r"哪里|哪儿|在哪|去哪|什么地方|哪个地方|哪家|哪个窗口|哪个网站"),
        re.compile(_PLACE_EN, _I), re.compile(_PLACE_ZH),
    ),
}

_EVASIVE = (
    re.compile(r"\b(?:sorry|unfortunately|unable to|not able to|can(?:no|')t (?:help|provide|answer|assist|share|discuss)|"
               r"cannot (?:help|provide|answer|assist)|(?:has|have) been (?:logged|recorded|forwarded|noted)|get back to you|"
               r"follow up|someone will|a specialist will|hold on|please wait|please consult|consult (?:a|your) |contact (?:a|your|our) |"
               r"depends on (?:your|the) (?:situation|circumstances|case)|it depends|no single answer|great question|"
               r"thanks for (?:reaching out|your (?:question|patience|message))|we will look into|we'll look into|"
               r"could you (?:provide|tell me|clarify)|can you (?:provide|tell me|clarify)|more details)\b", _I),
    re.compile(r"抱歉|对不起|不好意思|无法|不能回答|不便|暂时不|已记录|已收到|已反馈|已转|稍后|尽快|专人|请耐心|请稍等|请咨询|咨询专业|"
               r"联系客服|视情况|具体情况|因人而异|看情况|好问题|这个问题很好|感谢您的|请提供|请您提供|能否提供|更多信息|详细信息"),
)

FORM_FEATURES = ("form_asked", "form_met", "evasive")


def _has_han(text: str) -> bool:
    return any("\u3400" <= ch <= "\u9fff" for ch in text)


def asked_forms(query: str) -> list[str]:
    """The answer forms the question asks for (possibly none: "Tips for a first marathon")."""
    zh = _has_han(query)
    return [form for form, (en_q, zh_q, _, _) in _FORMS.items() if (zh_q if zh else en_q).search(query)]


def answer_has_form(answer: str, form: str) -> bool:
    """Whether the answer carries the cue of ``form`` (a time, a number, steps, ...)."""
    _, _, en_a, zh_a = _FORMS[form]
    return bool((zh_a if _has_han(answer) else en_a).search(answer))


def is_evasive(answer: str) -> bool:
    """Refusal, deflection or generic filler cues (a cue, not a verdict: the head weighs it)."""
    return any(pattern.search(answer) for pattern in _EVASIVE)


def form_features(query: str, answer: str) -> dict[str, float]:
    """``form_asked``: 1 when the question asks for a recognised form; ``form_met``: the share of
    the asked forms the answer has (0.5 when none was recognised, so an unknown form counts as
    neither met nor missed); ``evasive``: 1 when the answer has refusal or deflection cues."""
    forms = asked_forms(query)
    met = sum(answer_has_form(answer, form) for form in forms) / len(forms) if forms else 0.5
    return {"form_asked": float(bool(forms)), "form_met": met, "evasive": float(is_evasive(answer))}
