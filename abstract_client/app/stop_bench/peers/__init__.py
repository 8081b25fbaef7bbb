"""One short driver per client. ``own(trial)`` sets the client up as its users do and returns
the call, which stops by the client's own best documented way (or says it has none);
``library(trial)`` gives the same client this library's HTTP client (``abstract_client.sdk``)
and stops it with ``sdk.stop_on`` (a thread) or a cancelled task (asyncio). A call takes the
Stop button (``Press``) and returns the text its caller got, or raises what its caller catches.
``SERVERS`` names the servers a client speaks to; ``PACKAGES`` whose versions its rows name."""
