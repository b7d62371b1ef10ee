from .cli.entry import run

run()
