"""Every command: argument parsing and printing only. Each ``main()`` parses, asks the library
(``evaluation/``, ``search/``) and prints; nothing below this folder parses a command line."""
