"""The "Does memory help?" tab: a text and a Score button; the text read three ways
(segments alone, a sliding window, memory) with the time each took; and how far back the
model reads. The work is ``Server.score_check`` / ``Server.score`` (txl/serve.py), a
generator whose stages stream in as they are ready: memory first, the slow sliding window
last with its progress (txl/longwork.py runs it beside other visitors' Steps)."""

from __future__ import annotations

import gradio as gr

from txl import viz
from txl.serve import MAX_MEM_LEN

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

EXAMPLES = [[ROMEO_AND_JULIET], [REPEATED]]
EXAMPLE_LABELS = ["Romeo and Juliet, the balcony scene", "A quatrain, twice"]


def build(app) -> dict:
    """The tab's components. The text box opens with the first example, so that the first
    click of Score works."""
    mem_len = app.start_mem_len(app.default_model) if app.default_model else 0
    ui = {}
    with gr.Row():
        with gr.Column(scale=4, min_width=300):
            ui["score_text"] = gr.Textbox(
                ROMEO_AND_JULIET,
                lines=10,
                max_lines=20,
                label="Text to score",
                elem_id="score_text",
            )
            with gr.Row():
                ui["score_mem"] = gr.Slider(
                    0, MAX_MEM_LEN, value=mem_len, step=1, label="mem_len", min_width=160
                )
                ui["score"] = gr.Button(
                    "Score", variant="primary", elem_id="score_btn", min_width=90
                )
            gr.Examples(EXAMPLES, inputs=[ui["score_text"]], example_labels=EXAMPLE_LABELS)
            gr.Markdown(viz.SCORE_HELP)
        with gr.Column(scale=6, min_width=300):
            ui["score_md"] = gr.Markdown(label="bits per character", elem_id="score_summary")
            ui["score_plot"] = gr.Plot(
                show_label=False, label="Surprisal per character", elem_id="score_plot"
            )
            ui["context_md"] = gr.Markdown(elem_id="context_summary")
            ui["context_plot"] = gr.Plot(
                show_label=False, label="How far back does it read?", elem_id="context_plot"
            )
            gr.Markdown(viz.CONTEXT_HELP)
            with gr.Accordion("The numbers (JSON)", open=False):
                ui["score_numbers"] = gr.JSON(label="scores", elem_id="score_numbers")
    return ui


def wire(app, ui: dict, state: gr.State) -> None:
    """Score: a quick private check first (a text it cannot score gives its message and
    leaves the charts as they were), then the public ``/score`` stream. A second click
    starts a new Score, which cancels this session's running one on the server."""
    outputs = [ui[k] for k in ("score_plot", "score_md", "score_numbers")]
    outputs += [ui["context_plot"], ui["context_md"], state]
    ui["score"].click(
        app.score_click,
        [ui["score_text"], state],
        None,
        show_progress="hidden",
        api_visibility="private",
        concurrency_limit=None,  # a check of the text, quick: never waits for a slot
    ).success(
        app.score,
        [ui["score_text"], ui["score_mem"], state],
        outputs,
        api_name="score",
        trigger_mode="multiple",
        # Scores pace themselves beside Steps (txl/longwork.py); a few may run at once.
        concurrency_limit=2,
    )
