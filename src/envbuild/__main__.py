from envbuild.cli import main

main()
