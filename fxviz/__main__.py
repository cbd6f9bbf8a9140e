from fxviz.cli import main

main()
