"""Does a report page fit a laptop screen? Headless Chromium at a given width: overflow check and screenshot.

    python tools/report_layout.py REPORT.html [--width 1280] [--height 800] [--screenshot FIRST-SCREEN.png]

The page is loaded from a temporary copy that carries one more script, a probe admitted by the copy's
Content-Security-Policy (by its SHA-256, like the page's own): after the page has drawn itself it measures
`document.documentElement.scrollWidth` and every element whose box reaches past the window's right edge,
and every scrolling box whose content is wider than the box, and writes what it found into the DOM, which `--dump-dom` prints. The page itself is not changed. With
`--screenshot` the unchanged page's first screen (width x height) is saved as a PNG.

Prints one line, `PAGE at 1280 px: scrollWidth 1280 <= 1280, 0 boxes scroll sideways: no horizontal overflow`,
or the overflow and the elements that cause it (an element past the window's edge, or a box whose content is
wider than the box, such as a table in a scrolling box); the exit status is 0 when the page fits and 1 when it does not. Needs Debian's
chromium (`/usr/bin/chromium`); the test suite does not (what Python can check, it checks in tests).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Flags that start Chromium on a closed network: nothing is fetched, no profile is shared.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
PROBE_ID = "layout-probe"
PROBE = (
    "window.addEventListener('load', () => {"
    " const width = window.innerWidth, root = document.documentElement, wide = [];"
    " for (const node of document.body.querySelectorAll('*')) {"
    "  const box = node.getBoundingClientRect();"
    "  if (box.right > width + 0.5 && !(node.parentElement && node.parentElement.getBoundingClientRect().right > width + 0.5))"
    "   wide.push({tag: node.tagName.toLowerCase(), id: node.id, class: String(node.className), right: Math.round(box.right)});"
    " }"
    " const sideways = [...document.body.querySelectorAll('*')].filter(node =>"
    "  ['auto', 'scroll'].includes(getComputedStyle(node).overflowX) && node.scrollWidth > node.clientWidth + 1)"
    "  .map(node => ({tag: node.tagName.toLowerCase(), id: node.id, class: String(node.className),"
    "   scrollWidth: node.scrollWidth, clientWidth: node.clientWidth}));"
    " const out = document.createElement('pre'); out.id = '" + PROBE_ID + "';"
    " out.textContent = JSON.stringify({innerWidth: width, scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,"
    " wide: wide.slice(0, 20), sideways: sideways.slice(0, 20)});"
    " document.body.append(out);"
    "});"
)


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def probed_copy(page: str) -> str:
    """The page with the probe script appended and admitted by its Content-Security-Policy."""
    if "script-src " in page:
        probed = re.sub(r"(script-src )", lambda m: m.group(1) + _digest(PROBE) + " ", page, count=1)
    else:  # a page without script of its own (a kvsim run's)
        probed = page.replace("default-src 'none';", f"default-src 'none'; script-src {_digest(PROBE)};", 1)
    return probed.replace("</body>", f"<script>{PROBE}</script></body>", 1)


def chromium(profile: Path, *args: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("report_layout: chromium is not installed (Debian: apt-get install chromium)")
    result = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180
    )
    return result.stdout


def measure(page: Path, width: int, height: int, screenshot: Path | None) -> dict:
    """What the probe found on `page` at `width` x `height` (and the first screen saved to `screenshot`)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "probed.html"
        copy.write_text(probed_copy(page.read_text()))
        size = f"--window-size={width},{height}"
        dom = chromium(Path(scratch) / "profile-dom", size, "--virtual-time-budget=5000", "--dump-dom", copy.as_uri())
        if screenshot is not None:
            chromium(
                Path(scratch) / "profile-shot", size, f"--screenshot={screenshot.resolve()}", page.resolve().as_uri()
            )
    found = re.search(rf'<pre id="{PROBE_ID}">(.*?)</pre>', dom, re.S)
    if found is None:
        raise SystemExit(f"report_layout: the probe did not run on {page} (is it a jgpt report?)")
    return json.loads(html.unescape(found.group(1)))


def verdict(page: Path, width: int, measured: dict) -> tuple[bool, str]:
    """Whether the page fits `width`: nothing reaches past the window's edge and no box has to scroll sideways
    (a table wider than its box); one line saying so or naming what does not fit."""
    fits = measured["scrollWidth"] <= width and not measured["wide"] and not measured["sideways"]
    line = f"{page} at {width} px: scrollWidth {measured['scrollWidth']} {'<=' if measured['scrollWidth'] <= width else '>'} "
    line += f"{width}, {len(measured['sideways'])} boxes scroll sideways: "
    if fits:
        return True, line + "no horizontal overflow"
    culprits = [f"{_name(w)} reaches {w['right']} px" for w in measured["wide"]]
    culprits += [f"{_name(w)} holds {w['scrollWidth']} px in {w['clientWidth']}" for w in measured["sideways"]]
    return False, line + "horizontal overflow: " + "; ".join(culprits)


def _name(element: dict) -> str:
    return f"<{element['tag']}{' id=' + element['id'] if element['id'] else ''}{' class=' + element['class'] if element['class'] else ''}>"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, metavar="REPORT.html", help="a page written by `jgpt report`")
    parser.add_argument("--width", type=int, default=1280, help="window width in CSS pixels (default 1280)")
    parser.add_argument("--height", type=int, default=800, help="window height, the screenshot's (default 800)")
    parser.add_argument("--screenshot", type=Path, metavar="PNG", help="save the page's first screen here")
    args = parser.parse_args(argv)
    fits, line = verdict(args.page, args.width, measure(args.page, args.width, args.height, args.screenshot))
    print(line)
    if args.screenshot is not None:
        print(f"first screen ({args.width}x{args.height}) saved to {args.screenshot}")
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
