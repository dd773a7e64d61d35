import sys

from jax_drive.cli import main

sys.exit(main())
