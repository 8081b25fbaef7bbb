"""One module per backend. Each is wire mapping plus the engine's own stop hook, nothing else.

This folder is the package ``abstract_client.providers`` (a wheel ships it there; a checkout
maps it: ``abstract_client/_checkout.py``). Imported by the folder's own name it would be a
second module object of every lane — two ``OpenAICompatibleProvider`` classes, ``isinstance``
false across them — so that import is refused.
"""

if __name__ != "abstract_client.providers":
    raise ImportError(
        f"import the lanes as abstract_client.providers (this folder was imported as {__name__!r}: "
        "a second copy of every lane's module)"
    )

__all__: list[str] = []
