"""`python examples/start_agentic_pipeline.py --config_path DIR --config_name NAME [key=val ...]`"""

import os
import sys

from roll.cli import main

if __name__ == "__main__":
    sys.exit(main(examples_dir=os.path.dirname(os.path.abspath(__file__))))
