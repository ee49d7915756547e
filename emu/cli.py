"""`dyntra-emu` command line (placeholder until the CLI issue lands)."""

import sys


def main(argv=None) -> int:
    print("dyntra-emu: the emulator CLI is not built yet", file=sys.stderr)
    return 2
