"""The subcommands of `dapo` (dapo/cli.py dispatches by name), one module each: `add_arguments(parser)` (light, no
heavy imports) and `run(args) -> int`. A command wires parts of the package together; the parts never import a
command."""
