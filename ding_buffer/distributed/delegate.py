"""``delegated``: a class attribute that forwards to a helper object the instance holds (composition).

When a piece of a class moves into a helper (``ManagerCore.liveness``, ``RemoteBuffer``'s push pipeline),
its names stay where callers use them: ``seen = delegated('liveness', 'seen')`` makes ``core.seen`` the
helper's ``seen``, for reading and for writing.
"""


def delegated(holder: str, name: str) -> property:
    """A property reading and writing ``self.<holder>.<name>``."""
    return property(
        lambda self: getattr(getattr(self, holder), name),
        lambda self, value: setattr(getattr(self, holder), name, value),
        doc=f"``self.{holder}.{name}`` (moved there; the name stays for its callers)",
    )
