"""The docs' picture of judge-calibrate's report: docs/images/report.png, the top of report.html (its summary
and first plots) at 1400 px wide, as headless Chromium shows it. Made from a real run, never by hand:

    make demo && .venv/bin/python docs/report_screenshot.py demo_outputs/report

Needs Debian's chromium and chromium-driver (mmjudge/judge/testing/browser.py).
"""

import argparse
import sys
from pathlib import Path

from mmjudge.judge.testing.browser import Browser

IMAGE = Path(__file__).parent / "images" / "report.png"
WIDTH, HEIGHT = 1400, 1800  # CSS pixels: the summary and the first row of plots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_dir", nargs="?", default="demo_outputs/report", help="a judge-calibrate --output_dir (default: demo_outputs/report)")
    parser.add_argument("--output", default=str(IMAGE), help=f"the PNG written (default: {IMAGE})")
    args = parser.parse_args()
    with Browser() as chromium:
        page = chromium.open(Path(args.report_dir) / "report.html", WIDTH)
        if page.errors or not all(image.loaded for image in page.images):
            sys.exit(f"{args.report_dir}/report.html: {page.errors or 'an image did not load'}")
        chromium.screenshot(Path(args.output), height=min(HEIGHT, page.height))
    print(f"{args.output}: the top {min(HEIGHT, page.height)} px of {args.report_dir}/report.html at {WIDTH} px")
    return 0


if __name__ == "__main__":
    sys.exit(main())
