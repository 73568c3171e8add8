"""`python -m tokenspeed ...` is the same command line as `tokenspeed ...`."""

from console.cli import main

if __name__ == "__main__":
    main(prog_name="tokenspeed")
