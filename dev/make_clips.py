#!/usr/bin/env python3
"""Generate the synthetic speech test clips used by ostinato's tests.

Speech comes from espeak-ng, is resampled to 16 kHz mono by sox (float output,
so no dither is involved), mixed with seeded numpy noise / silence, quantised to
16 bit in numpy and written as FLAC by sox.  Everything is deterministic: the
same espeak-ng / sox versions give bit-identical files.

Usage:  python dev/make_clips.py            (writes tests/data/clips/*.flac
                                            and examples/sample.flac)
        python dev/make_clips.py --list     (print the clip table only)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SR = 16000
ROOT = Path(__file__).resolve().parent.parent
CLIP_DIR = ROOT / "tests" / "data" / "clips"
EXAMPLE = ROOT / "examples" / "sample.flac"

# Each clip: name -> dict(voice, speed, pitch, text, lead, tail, noise, snr, seed)
#   lead / tail : seconds of digital silence added before / after the speech
#   cut         : truncate the synthesised speech to this many seconds
#   noise       : None | "white" | "pink" | "brown"; snr in dB relative to the
#                 mean power of the speech part (silence padding excluded)
CLIPS: list[dict] = [
    dict(name="c01_hello_short", voice="en-us", speed=175, pitch=50,
         text="Hello there.", tail=0.25),
    dict(name="c02_numbers", voice="en-gb", speed=150, pitch=40,
         text="Call me at 555 0192 before 9:30 on March 3rd, 2024. "
              "The total came to $48.75."),
    dict(name="c03_questions_f3", voice="en+f3", speed=200, pitch=70,
         text="Where did you put the keys? Are they in the kitchen, or did you "
              "leave them in the car again?"),
    dict(name="c04_names_rp", voice="en-gb-x-rp", speed=160, pitch=50,
         text="Doctor Margaret Olsen met Professor Rajesh Kumar in Edinburgh. "
              "Later, they flew to Buenos Aires with Francesca and Tom."),
    dict(name="c05_white20_m3", voice="en+m3", speed=170, pitch=45,
         text="The weather forecast for tomorrow calls for light rain in the "
              "morning, clearing by noon, with a high of seventy two degrees. "
              "Winds will be calm.",
         noise="white", snr=20.0, seed=105),
    dict(name="c06_pink10_scotland", voice="en-gb-scotland", speed=140, pitch=55,
         text="Please remember to bring your passport and two printed copies of "
              "the booking.",
         noise="pink", snr=10.0, seed=106),
    dict(name="c07_brown5_f2", voice="en-us+f2", speed=180, pitch=60,
         text="Our quarterly revenue grew by twelve percent, while operating "
              "costs fell slightly. The board approved the new budget on "
              "Thursday, and hiring will resume in the spring.",
         noise="brown", snr=5.0, seed=107),
    dict(name="c08_story_long", voice="en-us", speed=175, pitch=50,
         text="Once upon a time, in a small village by the sea, there lived an "
              "old fisherman named Peter. Every morning he rowed his boat past "
              "the lighthouse and cast his nets into the cold, grey water. Most "
              "days he caught only a few sardines. But one stormy afternoon, "
              "his net grew so heavy that he could barely pull it in. What do "
              "you think he found? A wooden chest, covered in barnacles, with a "
              "brass lock that nobody in the village could open. So Peter carried "
              "it home on his back, and waited for morning."),
    dict(name="c09_fast_caribbean", voice="en-029", speed=220, pitch=50,
         text="Attention passengers. The ten fifteen train to Manchester "
              "Piccadilly will depart from platform four instead of platform "
              "nine. Passengers for Stockport, Macclesfield and Stoke should "
              "change at Crewe. We apologise for any inconvenience this may "
              "cause. Refreshments are available in coach C. Please keep your "
              "belongings with you at all times, and report any unattended "
              "items to a member of staff. Thank you for travelling with us "
              "today, and have a pleasant journey."),
    dict(name="c10_slow_rp", voice="en-gb-x-rp", speed=120, pitch=35,
         text="First, preheat the oven to two hundred degrees. Next, mix the "
              "flour, sugar and butter in a large bowl. Finally, bake for "
              "twenty minutes."),
    dict(name="c11_lead_silence", voice="en-us", speed=165, pitch=50,
         text="After a long pause, the speaker finally begins to talk about "
              "the meeting agenda.",
         lead=5.0),
    dict(name="c12_tail_word", voice="en-us", speed=175, pitch=50,
         text="Goodbye.", lead=12.0),
    dict(name="c13_nyc_white15", voice="en-us-nyc", speed=190, pitch=20,
         text="Listen, I told you already, the deli on Fifth Avenue closes at "
              "eleven. If you want the pastrami sandwich, you better get there "
              "before ten thirty. Do you understand me? Good. Now, about the "
              "tickets for Saturday's game: I've got two seats, section "
              "one hundred and eight, row F.",
         noise="white", snr=15.0, seed=113),
    dict(name="c14_klatt_mixed", voice="en-us+klatt", speed=160, pitch=65,
         text="Is it version 3.2, or 3.12? The release notes, dated July 4th, "
              "mention both; however, the changelog says otherwise!"),
    # Speech that runs past the end: cut mid-sentence at 29.0 s, so the decoder
    # ends the window on a timestamp pair and seeks to a second window.
    dict(name="c17_cut_two_windows", voice="en-us", speed=175, pitch=50,
         text="The museum opens at nine in the morning and closes at six in the "
              "evening. Tickets cost fifteen dollars for adults and eight dollars "
              "for children. Guided tours leave from the main hall every hour, "
              "and audio guides are available in five languages. Please do not "
              "touch the paintings or use flash photography. The cafe on the "
              "second floor serves coffee, sandwiches and cakes until five. "
              "Lockers for bags and coats can be found near the north entrance, "
              "next to the gift shop. On Sundays the museum hosts free concerts "
              "in the garden, weather permitting, and families are welcome to "
              "bring a picnic.",
         cut=29.0),
    # Non-speech clips.
    dict(name="c15_silence", silence=5.0),
    dict(name="c16_low_noise", noise_only=10.0, noise="pink", level_dbfs=-60.0,
         seed=116),
    # Long-form clips (several 30-s windows): speech in parts separated by pauses of
    # digital silence (`gaps`, seconds after each part but the last).
    dict(name="c18_long_lecture", voice="en-gb-x-gbclan", speed=140, pitch=45,
         parts=[
             "Good morning, everyone, and welcome back to the second lecture on the "
             "history of timekeeping. Last week we looked at sundials and water clocks, "
             "and we saw how the ancient Egyptians divided the day into twelve hours of "
             "light and twelve hours of darkness. Today we move forward to the "
             "mechanical clock, which appeared in European monasteries around the end "
             "of the thirteenth century. The key invention was the escapement, a small "
             "mechanism that releases the energy of a falling weight in regular steps.",
             "Early clocks were not very accurate. A good tower clock might gain or "
             "lose fifteen minutes in a single day, so it had to be corrected against "
             "a sundial whenever the sun was shining. That changed in sixteen fifty "
             "six, when Christiaan Huygens built the first pendulum clock, and the "
             "daily error fell to less than a minute. By the eighteenth century, "
             "instrument makers such as John Harrison were building marine "
             "chronometers precise enough to find a ship's longitude at sea. Please "
             "read chapter four before Thursday, and bring your questions.",
         ],
         gaps=[3.0]),
    # A phone call: band-limited to 3.4 kHz (which also keeps the FLAC small), pink noise.
    dict(name="c19_long_noisy_f4", voice="en-us+f4", speed=130, pitch=65,
         parts=[
             "Hi, this is Maria from the customer support team, returning your call "
             "about the delivery that was scheduled for last Tuesday. I checked the "
             "tracking number you gave me, and it looks like the parcel left our "
             "warehouse in Denver on the fourteenth, but it was held at the regional "
             "sorting center because the street address was missing an apartment "
             "number. I have already updated the address in our system, so the "
             "parcel should be released tomorrow morning.",
             "You will receive a text message with a new delivery window, usually "
             "between nine and noon. If nobody is at home, the driver will leave a "
             "note, and you can pick the parcel up at the post office on Maple Street "
             "after four in the afternoon. Because of the delay, we are also refunding "
             "the shipping fee of twelve dollars and fifty cents to your credit card. "
             "The refund can take three to five business days to appear.",
             "If you have any other questions, you can reach us at eight hundred, "
             "five five five, zero one four two, from Monday to Friday, between eight "
             "in the morning and six in the evening. You can also write to us through "
             "the contact form on our website. Thank you for your patience, and have a "
             "wonderful rest of your day. Goodbye.",
         ],
         gaps=[3.0, 5.0],
         noise="pink", snr=15.0, seed=119, lowpass=3400.0),
]
LONG_MAX_SECONDS = 120.0  # clips with `parts` may span several windows

EXAMPLE_CLIP = dict(
    name="sample", voice="en-us", speed=160, pitch=50,
    text="Welcome to ostinato. This short recording is read by a speech "
         "synthesizer, and it makes a quick first test.")


def synth(voice: str, speed: int, pitch: int, text: str) -> np.ndarray:
    """espeak-ng -> 16 kHz mono float32 via sox (no dither with float output)."""
    with tempfile.TemporaryDirectory() as td:
        wav = Path(td) / "tts.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch),
                        "-w", str(wav), text], check=True)
        raw = subprocess.run(
            ["sox", "-V1", str(wav), "-t", "raw", "-e", "floating-point", "-b", "32",
             "-c", "1", "-r", str(SR), "-"],
            check=True, capture_output=True).stdout
    x = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    # trim espeak's own leading/trailing silence so lead/tail are exact
    nz = np.flatnonzero(np.abs(x) > 1e-3)
    if len(nz):
        x = x[max(nz[0] - 160, 0): nz[-1] + 1 + 1600]  # keep 10 ms before, 100 ms after
    return x


def make_noise(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n)
    if kind == "white":
        y = w
    elif kind == "pink":
        spec = np.fft.rfft(w)
        f = np.arange(len(spec), dtype=np.float64)
        f[0] = 1.0
        y = np.fft.irfft(spec / np.sqrt(f), n)
    elif kind == "brown":
        y = np.cumsum(w)
        # remove the slow drift with a one-pole high-pass at ~20 Hz
        a = np.exp(-2 * np.pi * 20.0 / SR)
        out = np.empty_like(y)
        prev_x = 0.0
        prev_y = 0.0
        for i, v in enumerate(y):
            prev_y = a * (prev_y + v - prev_x)
            prev_x = v
            out[i] = prev_y
        y = out
    else:
        raise ValueError(kind)
    return y / np.sqrt(np.mean(y ** 2))


def render(c: dict) -> np.ndarray:
    if "silence" in c:
        return np.zeros(int(round(c["silence"] * SR)))
    if "noise_only" in c:
        n = int(round(c["noise_only"] * SR))
        return make_noise(c["noise"], n, c["seed"]) * 10 ** (c["level_dbfs"] / 20)
    if "parts" in c:
        return render_parts(c)
    speech = synth(c["voice"], c["speed"], c["pitch"], c["text"])
    speech = speech / np.max(np.abs(speech)) * 0.5  # -6 dBFS peak
    if c.get("cut"):
        speech = speech[: int(round(c["cut"] * SR))]
    if c.get("noise"):
        p_sig = np.mean(speech ** 2)
        noise = make_noise(c["noise"], len(speech), c["seed"])
        speech = speech + noise * np.sqrt(p_sig / 10 ** (c["snr"] / 10))
    lead = np.zeros(int(round(c.get("lead", 0.0) * SR)))
    tail = np.zeros(int(round(c.get("tail", 0.0) * SR)))
    x = np.concatenate([lead, speech, tail])
    peak = np.max(np.abs(x))
    if peak > 0.95:
        x = x * (0.95 / peak)
    return x


def render_parts(c: dict) -> np.ndarray:
    """Speech in parts with silent gaps; noise (if any) over the whole clip, gaps included,
    `snr` dB below the mean power of the speech parts."""
    pieces, is_speech = [], []
    for i, text in enumerate(c["parts"]):
        speech = synth(c["voice"], c["speed"], c["pitch"], text)
        pieces.append(speech)
        is_speech.append(np.ones(len(speech), dtype=bool))
        if i < len(c["gaps"]):
            gap = int(round(c["gaps"][i] * SR))
            pieces.append(np.zeros(gap))
            is_speech.append(np.zeros(gap, dtype=bool))
    x = np.concatenate(pieces)
    speech_mask = np.concatenate(is_speech)
    x = x / np.max(np.abs(x)) * c.get("peak", 0.5)  # -6 dBFS peak unless given
    if c.get("noise"):
        p_sig = np.mean(x[speech_mask] ** 2)
        noise = make_noise(c["noise"], len(x), c["seed"])
        x = x + noise * np.sqrt(p_sig / 10 ** (c["snr"] / 10))
    if c.get("lowpass"):  # band-limit like a telephone line (FFT brick wall)
        spec = np.fft.rfft(x)
        spec[np.fft.rfftfreq(len(x), 1.0 / SR) > c["lowpass"]] = 0.0
        x = np.fft.irfft(spec, len(x))
    peak = np.max(np.abs(x))
    if peak > 0.95:
        x = x * (0.95 / peak)
    return x


def write_flac(x: np.ndarray, path: Path) -> None:
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sox", "-V1", "-t", "raw", "-e", "signed-integer", "-b", "16",
                    "-c", "1", "-r", str(SR), "-", "-C", "8", str(path)],
                   input=pcm.tobytes(), check=True)


def describe(c: dict, n: int) -> dict:
    d = {k: v for k, v in c.items() if k != "name"}
    d["duration_s"] = round(n / SR, 3)
    return d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for c in CLIPS:
            print(c["name"], {k: v for k, v in c.items() if k not in ("name", "text")})
        return 0
    CLIP_DIR.mkdir(parents=True, exist_ok=True)
    for old in CLIP_DIR.glob("*.flac"):
        old.unlink()
    manifest = {}
    for c in CLIPS:
        x = render(c)
        dur = len(x) / SR
        assert 0.5 < dur < (LONG_MAX_SECONDS if "parts" in c else 30.0), (c["name"], dur)
        path = CLIP_DIR / f"{c['name']}.flac"
        write_flac(x, path)
        manifest[path.name] = describe(c, len(x))
        print(f"{path.name:28s} {dur:6.2f} s  {path.stat().st_size / 1024:7.1f} KiB")
    x = render(EXAMPLE_CLIP)
    write_flac(x, EXAMPLE)
    print(f"{EXAMPLE.relative_to(ROOT)} {len(x) / SR:6.2f} s")
    total = sum(p.stat().st_size for p in CLIP_DIR.iterdir())
    print(f"total tests/data/clips: {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
