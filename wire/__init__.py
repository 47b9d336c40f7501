"""wire: the words the platform's parts exchange that every one of them reads (docs/adr/0012).

The API, the scheduler, the driver and the CLI/SDK may all import this package, and it imports none of them:
it holds declarations only (enums and their sets), so importing it costs the CLI nothing. `wire.jobs`: a
job's status and failure reason.
"""
