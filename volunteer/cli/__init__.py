"""The ``volunteer`` command: join (the daemon around ``open_volunteer``, its control socket and
dashboard), status/pause/resume/stop, experts, testnet, relay, doctor, ping, perf and the demo."""
