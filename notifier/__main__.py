import sys

from notifier.cli import main

sys.exit(main())
