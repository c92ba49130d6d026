"""Built-in vocabularies for synthetic tasks, and a seeded stream of invented words.

The lists are disjoint by construction (checked in the tests): a needle's key or value never
occurs in the filler text, so its single appearance in a prompt is the evidence for the answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

# Halves of needle keys such as "amber-falcon".
KEY_ADJECTIVES: tuple[str, ...] = (
    "amber", "azure", "crimson", "golden", "silver", "velvet", "hollow", "frozen", "silent",
    "marble", "ancient", "scarlet", "emerald", "ivory", "rustic", "lunar", "solar", "misty",
    "stormy", "gentle", "coral", "violet", "jade", "cobalt", "dusky", "frosty", "glassy",
    "mossy", "oaken", "pearly", "rosy", "sandy", "smoky", "starry", "sunny", "twilight",
)
KEY_NOUNS: tuple[str, ...] = (
    "falcon", "orchid", "comet", "glacier", "meteor", "canyon", "harp", "willow", "beacon",
    "dolphin", "summit", "prism", "tundra", "badger", "galaxy", "nebula", "pebble", "quill",
    "raven", "otter", "lynx", "heron", "cypress", "fjord", "geyser", "lagoon", "mesa", "oasis",
    "sparrow", "thistle", "walnut", "fern", "kestrel", "marten", "acorn", "bison",
)

# Values of word-type needles.
VALUE_WORDS: tuple[str, ...] = (
    "marigold", "obsidian", "tambourine", "cinnamon", "zeppelin", "porcupine", "saxophone",
    "avalanche", "labyrinth", "mandolin", "pelican", "tornado", "volcano", "walrus", "yogurt",
    "kaleidoscope", "chameleon", "trombone", "asteroid", "gondola", "hammock", "igloo", "jaguar",
    "koala", "lemonade", "mosaic", "nutmeg", "octopus", "papaya", "quokka", "rhubarb",
    "sapphire", "tapestry", "umbrella", "vanilla", "wombat", "xylophone", "zucchini", "accordion",
    "blizzard", "cactus", "dragonfly", "flamingo", "gargoyle", "harmonica", "iceberg",
    "jellyfish", "kiwi", "lighthouse", "meerkat", "noodle", "origami", "pretzel", "quartz",
    "rickshaw", "sombrero", "trampoline", "unicorn", "vortex", "waffle",
)

# Filler grammar (see kvdrift.data.filler); lower case, no digits, no needle words.
FILLER_SUBJECTS: tuple[str, ...] = (
    "the old farmer", "a young painter", "the village teacher", "my neighbour", "the traveller",
    "a quiet student", "the baker", "the harbour master", "an elderly librarian",
    "the gardener", "a curious child", "the ferryman", "the shepherd", "a tired merchant",
    "the carpenter", "the choir", "a small crowd", "the committee", "the miller",
    "a stranger from the hills", "the blacksmith", "my grandmother", "the postman",
    "a group of friends",
)
FILLER_VERBS: tuple[str, ...] = (
    "carried", "painted", "mended", "admired", "described", "noticed", "collected", "repaired",
    "studied", "sold", "borrowed", "cleaned", "measured", "sketched", "polished", "examined",
    "packed", "lifted", "counted", "folded", "wrapped", "delivered",
)
FILLER_OBJECTS: tuple[str, ...] = (
    "a wooden chair", "the garden gate", "an old map", "the broken clock", "a basket of apples",
    "the morning letters", "a heavy coat", "the kitchen table", "a set of brushes",
    "the tall ladder", "a bundle of firewood", "the little boat", "a pair of boots",
    "the river stones", "a jar of honey", "the dusty books", "a woollen blanket",
    "the copper kettle", "a bag of flour", "the faded curtains", "a box of candles",
    "the iron bench",
)
FILLER_PLACES: tuple[str, ...] = (
    "near the river", "in the market square", "behind the chapel", "on the hillside",
    "at the edge of the forest", "beside the mill", "in the narrow lane", "under the old bridge",
    "by the harbour wall", "in the back garden", "along the canal", "at the crossroads",
    "inside the barn", "on the station platform", "next to the bakery",
)
FILLER_TIMES: tuple[str, ...] = (
    "early in the morning", "after the rain", "before supper", "late in the afternoon",
    "on a windy day", "during the festival", "at the end of the week", "while the bells rang",
    "just after dawn", "in the last days of autumn", "on a cold evening", "when the snow melted",
)
FILLER_SCENES: tuple[str, ...] = (
    "the market", "the valley", "the town hall", "the library", "the orchard", "the harbour",
    "the school yard", "the old road", "the square", "the meadow", "the workshop",
)
FILLER_MOODS: tuple[str, ...] = (
    "calm", "busy", "bright", "crowded", "peaceful", "grey", "warm", "noisy", "quiet",
    "cheerful", "gloomy", "pleasant",
)
FILLER_REFLECTIONS: tuple[str, ...] = (
    "Nobody in the town could remember a season quite like that one.",
    "Small habits, repeated patiently, tend to shape a whole life.",
    "People often say that a good road is worth more than a fine house.",
    "The work was slow, but nobody seemed to mind the waiting.",
    "Some of the older families still tell the story in their own way.",
    "A careful plan rarely survives the first real day of work.",
    "There is a kind of comfort in doing the same task well each day.",
    "Most visitors left with the feeling that they had missed something.",
    "Good neighbours are easier to keep than to find.",
    "It is hard to say whether the change was for better or for worse.",
    "The weather, as usual, decided more than anyone had planned.",
    "Every small village keeps a few secrets that everybody knows.",
)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gl",
           "kr", "st", "tr", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "m")


def real_words() -> tuple[str, ...]:
    """Every single word of the built-in vocabularies, deduplicated, in a fixed order."""
    phrases = (
        KEY_ADJECTIVES + KEY_NOUNS + VALUE_WORDS + FILLER_SUBJECTS + FILLER_VERBS
        + FILLER_OBJECTS + FILLER_PLACES + FILLER_TIMES + FILLER_SCENES + FILLER_MOODS
    )
    seen: dict[str, None] = {}
    for phrase in phrases:
        for word in phrase.split():
            if len(word) > 3:
                seen.setdefault(word, None)
    return tuple(seen)


def invented_words(rng: random.Random, exclude: frozenset[str] = frozenset()) -> Iterator[str]:
    """Endless stream of distinct pronounceable made-up words (two or three syllables)."""
    seen = set(exclude)
    while True:
        n_syllables = rng.choice((2, 2, 3))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(n_syllables)
        )
        if word not in seen:
            seen.add(word)
            yield word


class WordStream:
    """Prefix-stable sequence of distinct words: shuffled real words first, then invented ones.

    ``take(n)`` always returns the same first ``n`` words for the same seed, so a task can grow
    or shrink its word list while fitting a token budget without changing earlier words.
    """

    def __init__(self, seed: int, *, real_first: bool = True) -> None:
        rng = random.Random(seed)
        real = list(real_words()) if real_first else []
        rng.shuffle(real)
        self._words: list[str] = real
        self._invented = invented_words(rng, exclude=frozenset(real_words()))

    def take(self, n: int) -> list[str]:
        """The first ``n`` words of the stream."""
        while len(self._words) < n:
            self._words.append(next(self._invented))
        return self._words[:n]
