"""``python -m envlayers``: the CLI, for job scripts that call the interpreter directly."""

from .cli import main

if __name__ == "__main__":
    main()
