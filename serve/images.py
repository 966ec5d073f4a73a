"""A request's images as files the scoring code reads: base64 data URLs written to a private temporary
directory, or paths confined to --image_root.

A path is refused with one message whatever the reason (outside --image_root, through a link that leads
out, missing, a directory, not an image), so that a client learns nothing of which files exist on the
server. URLs of other schemes are refused too: a server that fetched them could be made to reach
addresses only it can reach.
"""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
from pathlib import Path

from PIL import Image

from mmjudge.serve.api import RequestError

WHITESPACE = re.compile(r"[ \t\n\r\f\v]+")


class RequestImages:
    """The images of one request; `close` deletes the ones it wrote."""

    def __init__(self, image_root: Path | None, max_pixels: int):
        self.image_root = image_root  # resolved (serve/service.py's Service resolves it once, not each request)
        self.max_pixels = max_pixels
        # made at the first data URL: most requests name paths, and making and deleting a directory for each one
        # was a tenth of a one-sample request's time in the server's event loop
        self._dir: tempfile.TemporaryDirectory | None = None
        self._count = 0

    def file(self, reference: str, field: str) -> Path:
        """The file of an image named in a request (a data URL or a path), checked to be an image within
        the pixel limit, decoded once here so that no batch fails on it later."""
        if reference.startswith("data:"):
            path = self._write(reference, field)
        elif "://" in reference:
            raise RequestError(400, field, "send the image as a base64 data URL (data:image/png;base64,...) or a path under the "
                                           "server's --image_root; it fetches no URL")
        else:
            path = self._confined(reference, field)
        self._check(path, field, from_client=reference.startswith("data:"))
        return path

    def _write(self, url: str, field: str) -> Path:
        header, comma, data = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise RequestError(400, field, "a data URL must be base64: data:image/png;base64,...")
        try:
            # ASCII whitespace is skipped, as standard (RFC 2045) decoders and OpenAI's service skip it: lmms-eval's
            # wildvision sends "base64, <data>", with a space; any other character outside base64 is refused
            content = base64.b64decode(WHITESPACE.sub("", data), validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(400, field, "the data URL's base64 does not decode") from None
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="judge-serve-")
        self._count += 1
        path = Path(self._dir.name) / f"image-{self._count}"
        path.write_bytes(content)
        return path

    def _confined(self, reference: str, field: str) -> Path:
        refused = RequestError(400, field, "no image at this path under the server's --image_root "
                                           "(paths outside it, and files that are not images, are refused alike)")
        if self.image_root is None:
            raise RequestError(400, field, "this server was started without --image_root: send images as base64 data URLs")
        try:
            path = (self.image_root / reference).resolve()  # an absolute reference replaces the root, then must lie within it
            if not path.is_relative_to(self.image_root) or not path.is_file():
                raise refused
        except (OSError, RuntimeError, ValueError):  # a NUL byte, a link loop, a name longer than the filesystem takes
            raise refused from None  # never the OSError's own words, which name the server's folders
        return path

    def _check(self, path: Path, field: str, from_client: bool) -> None:
        """Pixel count from the header first, so a small file that decodes to gigabytes is never decoded."""
        def refused(why: str) -> RequestError:
            # A file under the root that is no image gets the same answer as a missing one.
            return RequestError(400, field, why if from_client else "no image at this path under the server's --image_root "
                                                                    "(paths outside it, and files that are not images, are refused alike)")
        try:
            with Image.open(path) as image:
                width, height = image.size
                if width * height > self.max_pixels:
                    raise RequestError(413, field, f"the image is {width} x {height} pixels, over this server's limit of "
                                                   f"{self.max_pixels} (--max_image_pixels)")
                image.load()
        except Image.DecompressionBombError:
            raise RequestError(413, field, f"the image is over this server's limit of {self.max_pixels} pixels (--max_image_pixels)") from None
        except RequestError:
            raise
        except Exception as err:  # PIL raises many types for a broken file; all mean the same to the client
            raise refused(f"not a decodable image ({type(err).__name__})") from None

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
