"""`python -m emu ...` is `dyntra-emu ...`."""

import sys

from emu.cli.main import main

if __name__ == "__main__":  # rank processes re-import this module under spawn
    sys.exit(main())
