"""kenning.storage; see the kenning package."""

# The folder is also reachable by its bare name from a checkout's root: a second copy of every
# module (a second Celery app with none of the tasks, say). Only the kenning name is allowed.
if __name__ != "kenning.storage":
    raise ImportError(
        f"import kenning.storage, not {__name__}: kenning's folders live under the kenning package"
    )
