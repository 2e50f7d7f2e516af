from entroloop.cli import main

main()
