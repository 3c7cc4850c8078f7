"""Helpers for testing and benchmarking localstate against real servers (not used at run time).

`localstate._testing.postgres_server.PostgresServer` starts a throwaway PostgreSQL from the
distribution's binaries; the test suite and the benchmarks import it from here.
"""
