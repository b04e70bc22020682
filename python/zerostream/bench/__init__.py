"""`zerostream bench NAME`: each module here defines add_arguments(parser) and run(args) -> int."""
