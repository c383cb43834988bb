"""The example texts and settings the tabs offer (plain data: no Gradio, so benchmarks and
scripts can read it)."""

import json
from pathlib import Path

# Public domain: Shakespeare, Romeo and Juliet, act 2 scene 2 (the balcony scene).
ROMEO_AND_JULIET = """\
ROMEO:
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon,
Who is already sick and pale with grief,
That thou her maid art far more fair than she:
Be not her maid, since she is envious;
Her vestal livery is but sick and green
And none but fools do wear it; cast it off.
It is my lady, O, it is my love!
O, that she knew she were!
She speaks yet she says nothing: what of that?
Her eye discourses; I will answer it.
I am too bold, 'tis not to me she speaks:
Two of the fairest stars in all the heaven,
Having some business, do entreat her eyes
To twinkle in their spheres till they return.
What if her eyes were there, they in her head?
The brightness of her cheek would shame those stars,
As daylight doth a lamp; her eyes in heaven
Would through the airy region stream so bright
That birds would sing and think it were not night.
See, how she leans her cheek upon her hand!
O, that I were a glove upon that hand,
That I might touch that cheek!

JULIET:
Ay me!

ROMEO:
She speaks:
O, speak again, bright angel! for thou art
As glorious to this night, being o'er my head
As is a winged messenger of heaven
Unto the white-upturned wondering eyes
Of mortals that fall back to gaze on him
When he bestrides the lazy-pacing clouds
And sails upon the bosom of the air.

JULIET:
O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name;
Or, if thou wilt not, be but sworn my love,
And I'll no longer be a Capulet.

ROMEO:
Shall I hear more, or shall I speak at this?

JULIET:
'Tis but thy name that is my enemy;
Thou art thyself, though not a Montague.
What's Montague? it is nor hand, nor foot,
Nor arm, nor face, nor any other part
Belonging to a man. O, be some other name!
What's in a name? that which we call a rose
By any other name would smell as sweet;
So Romeo would, were he not Romeo call'd,
Retain that dear perfection which he owes
Without that title. Romeo, doff thy name,
And for that name which is no part of thee
Take all myself.
"""

# Public domain: Shakespeare, Sonnet 18, its first quatrain twice. The second copy is
# within reach of a 128-token memory: watch its surprisal drop when memory is on.
_QUATRAIN = """\
Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date.
"""
REPEATED = _QUATRAIN + "\n" + _QUATRAIN

# The texts the tabs offer, by label: the first fills the text boxes when the page opens.
EXAMPLES = {"Romeo and Juliet, the balcony scene": ROMEO_AND_JULIET, "A quatrain, twice": REPEATED}

# The recall probe's filler (txl/recall.py): the balcony scene read on, 2,048 characters and
# more of ordinary Shakespeare, so that the longest probe repeats none of it.
RECALL_FILLER = (
    ROMEO_AND_JULIET
    + """
ROMEO:
I take thee at thy word:
Call me but love, and I'll be new baptized;
Henceforth I never will be Romeo.

JULIET:
What man art thou that thus bescreen'd in night
So stumblest on my counsel?

ROMEO:
By a name
I know not how to tell thee who I am:
My name, dear saint, is hateful to myself,
Because it is an enemy to thee;
Had I it written, I would tear the word.
"""
)

# Public domain: Shakespeare, Hamlet, act 1 scene 1, its opening (not in Tiny Shakespeare).
# The recall probe's default text before its speaker enters: a scene already under way, as a
# model trained on one long stream reads a name best (txl/recall.py).
RECALL_BEFORE = """\
BERNARDO:
Who's there?

FRANCISCO:
Nay, answer me: stand, and unfold yourself.

BERNARDO:
Long live the king!

FRANCISCO:
Bernardo?

BERNARDO:
He.

FRANCISCO:
You come most carefully upon your hour.

BERNARDO:
'Tis now struck twelve; get thee to bed, Francisco.

FRANCISCO:
For this relief much thanks: 'tis bitter cold,
And I am sick at heart.

"""

# The recall probe's speaker (the Recall tab's default, and the Watch tab's example of it).
DEFAULT_NAME = "ZANTHOR"  # no play has him: only a recall can finish the name
# Watch it opens on k = 64: the name's letters then lie 122-128 characters before the first
# scored one, beyond the window (64) but inside the bundled model's memory (128), where only
# memory can see them (at k = 128 they lie past a memory of 128 too: recalled with 512 only).
DEFAULT_WATCH = 64

# The page's sampler: temperature 0.8, the nucleus cut to 0.9 (Holtzman et al., 2020). The
# cut drops the least likely tenth of each step's distribution, the tail a character
# model's samples stray into: from a real scene the bundled model writes the scene's own
# speakers back far more often with it (the model card reads both, with the cut and
# without: scripts/generation_check.py, whose default is this sampler).
TEMPERATURE = 0.8
TOP_P = 0.9


def read_report(path: Path, entries: str, needed: str) -> dict | None:
    """A script's JSON report that a tab offers examples from, or None when the file is
    missing, unreadable, or has no ``report[entries][0][needed]`` (the one thing the tab
    needs of it): the tab then says why it offers fewer examples, and the page still runs."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        report[entries][0][needed]  # noqa: B018
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return report
