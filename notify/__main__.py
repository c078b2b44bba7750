from notify.cli import main

main()
