"""Names in errors: the hint every "unknown name" error ends with, and the
one registry of named objects (attention mechanisms, linear attention's
feature maps, samplers, activations, the classes a config may name)."""

import difflib


def did_you_mean(name, candidates, n=3, cutoff=0.6):
    """`" Did you mean: a, b?"` with the known names closest to `name`
    (compared regardless of case), or `""` when none is close.

    >>> did_you_mean("top-p", ["greedy", "top_k", "top_p"])
    ' Did you mean: top_p, top_k?'
    >>> did_you_mean("GPT2", ["gpt2", "gpt2_medium", "bert_base"])
    ' Did you mean: gpt2?'
    """
    by_folded = {}
    for candidate in candidates:
        by_folded.setdefault(str(candidate).lower(), []).append(candidate)
    close = difflib.get_close_matches(str(name).lower(), list(by_folded), n=n, cutoff=cutoff)
    names = [str(candidate) for folded in close for candidate in by_folded[folded]][:n]
    return f" Did you mean: {', '.join(names)}?" if names else ""


class NameRegistry:
    """Objects registered under unique names, with the library's errors for
    a duplicate or an unknown name.

    Args:
        kind: str. What the objects are, for messages (`"attention
            mechanism"`).
        plural: str. The plural of the last word of `kind`, for the list
            of known names (`"mechanisms"`).
        entries: dict or None. Objects to register at once, by name.

    Example:

    >>> colours = NameRegistry("colour", "colours")
    >>> colours.add("red", 1)
    >>> colours.get("red"), colours.names()
    (1, ['red'])
    >>> colours.get("rod")
    Traceback (most recent call last):
    ...
    ValueError: Unknown colour 'rod'. Did you mean: red? Known colours: red.
    """

    def __init__(self, kind, plural, entries=None):
        self.kind = kind
        self.plural = plural
        self._entries = {}
        for name, value in (entries or {}).items():
            self.add(name, value)

    def add(self, name, value):
        """Registers `value` as `name`; a name can be taken only once."""
        if name in self._entries:
            article = "An" if self.kind[0] in "aeiou" else "A"
            raise ValueError(f"{article} {self.kind} named '{name}' already exists.")
        self._entries[name] = value

    def register(self, name):
        """Decorator form of `add`."""

        def decorator(value):
            self.add(name, value)
            return value

        return decorator

    def __contains__(self, name):
        return name in self._entries

    def names(self):
        """Every registered name, sorted."""
        return sorted(self._entries)

    def get(self, name, note=""):
        """The object registered as `name`.

        Raises:
            ValueError: for an unknown name, with the close names and all
                known ones (then `note`, if given).
        """
        if name not in self._entries:
            known = ", ".join(self.names())
            raise ValueError(
                f"Unknown {self.kind} '{name}'.{did_you_mean(name, self.names())} "
                f"Known {self.plural}: {known}{note}."
            )
        return self._entries[name]
