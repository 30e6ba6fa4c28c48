import sys

from devpilot.cli import main

sys.exit(main())
