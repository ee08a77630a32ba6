"""``deepspeed.launcher.launch`` as the hostile launcher: ``main()`` exits with its status."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hostile_deepspeed  # noqa: E402


def main():
    sys.exit(hostile_deepspeed.main(launcher="launch"))


if __name__ == "__main__":
    main()
