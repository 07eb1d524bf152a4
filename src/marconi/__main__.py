from __future__ import annotations

import sys

from marconi.cli import main

sys.exit(main())
