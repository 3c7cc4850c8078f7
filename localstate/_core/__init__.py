"""The foundation: what every layer above shares and that imports nothing of localstate's but
`localstate.errors`.

The data model and its codec, the rows a flush carries, conflict policies, the settings and
their specs, the HTTP protocol the server, the client and the API sink share, and the small
mechanisms (backoff, file locks, futures, lanes) the cache and the sync worker both use. This
file imports nothing: import the modules themselves.
"""
