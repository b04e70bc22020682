"""The `zerostream` command."""
import sys

def main(argv=None):
    print("zerostream")
    return 0

if __name__ == "__main__":
    sys.exit(main())
