"""The serving core, which knows no API: the one internal request (request.py) and the building of its
SamplingParams/SpecParams over a profile (params.py, profiles.py); a request's run (jobs.py) on the
slots and the engine thread (scheduler.py, batcher.py); its answer as events (events.py, answer.py);
output constraints and tools (constraints/); metrics, the token trace; the models
freed while idle and loaded again by a request (sleep.py)."""
