"""`python -m emu ...` is `dyntra-emu ...`."""

from emu.cli.main import console_main

if __name__ == "__main__":  # rank processes re-import this module under spawn
    console_main()
