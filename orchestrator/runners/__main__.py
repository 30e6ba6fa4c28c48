import sys

from orchestrator.runners.main import main

sys.exit(main())
