"""HTTP/1.x on the server's connections: requests parsed from the bytes come so far, answers.

The server's reactor thread feeds a :class:`RequestParser` the bytes of one connection as they
come and never waits for more, so that a client that sends nothing, or a byte at a time,
holds no thread. A small parser of our own rather than http.server: that module (with email
and html) costs the daemon ~30 ms of imports on every socket-activated start, and the shims'
requests are one simple shape. Every refusal is an exception whose message says what was
wrong: :class:`BadRequest` for the head, a :class:`~multusd.errors.MultusError` for the body.
:class:`Connection` is what the reactor keeps of each connection it owns.
"""

from __future__ import annotations

import re
import selectors
import socket
from typing import Optional

from multusd.core.request import decode_body
from multusd.errors import DecodeFailure, InvalidEnvironment, MultusError

MAX_BODY = 4 * 1024 * 1024
READ_TIMEOUT = 30.0  # seconds for a whole request, and for each answer's writes
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100
MAX_HEAD = 65536  # request line and headers together
STATUS_PHRASES = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found",
                  405: "Method Not Allowed", 408: "Request Timeout",
                  500: "Internal Server Error", 503: "Service Unavailable"}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_SINGLE_HEADERS = ("content-length", "transfer-encoding")

# What the parser waits for next.
HEAD, BODY, DONE = "head", "body", "done"


class BadRequest(Exception):
    """The bytes on the connection are not an HTTP/1.x request."""


def response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    """A whole answer, head and body in one buffer (one write: no Nagle delay between them).

    ``Connection: close`` is always answered, as upstream's daemon disables keep-alive.
    """
    return (f"HTTP/1.1 {status} {STATUS_PHRASES.get(status, '')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class RequestParser:
    """One request: :meth:`feed` bytes, :meth:`parse` as far as they go, :meth:`at_eof` at the
    end of the stream. The head is parsed first; the body only after :meth:`expect_body`."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.state = HEAD
        self.method = ""
        self.path = ""
        self.headers: dict = {}
        self.body = b""
        self.received = 0  # every byte fed, for the read-deadline message
        self._line_seen = False
        self._head_size = 0
        self._header_count = 0
        self._length: Optional[int] = None  # Content-Length of the body being read
        self._chunks: Optional[bytearray] = None  # a chunked body so far
        self._chunk_left = -1  # -1: a size line is next; -2: the CRLF after a chunk's data

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self.buffer += data

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"

    def parse(self) -> str:
        """Consume what the buffer holds; the state reached (HEAD, BODY or DONE)."""
        if self.state == HEAD:
            self._parse_head()
        if self.state == BODY:
            self._parse_body()
        return self.state

    def at_eof(self) -> None:
        """The client closed its side: a request cut short is refused (nothing to say if it
        sent nothing at all: a probe that connected and went away)."""
        if self.state == HEAD and self.received:
            if not self._line_seen:
                self._request_line(bytes(self.buffer))  # a malformed one names itself
            raise BadRequest("the request head ended before its blank line")
        if self.state == BODY and (self._chunks is not None or self._length is not None):
            if self._chunks is not None:
                raise DecodeFailure(f"the chunked request body ended after "
                                    f"{len(self._chunks)} bytes: the request was not run")
            raise DecodeFailure(f"the request body ended after {len(self.buffer)} of its "
                                f"{self._length} bytes: the request was not run")

    # -- head -------------------------------------------------------------------------------
    def _parse_head(self) -> None:
        while self.state == HEAD:
            end = self.buffer.find(b"\n", 0, MAX_HEADER_LINE + 1)
            if end < 0:
                if len(self.buffer) > MAX_HEADER_LINE:
                    if not self._line_seen:
                        self._request_line(bytes(self.buffer[:100]))
                    raise BadRequest("header line too long")
                return
            line = bytes(self.buffer[:end + 1])
            del self.buffer[:end + 1]
            if not self._line_seen:
                self._request_line(line)
                self._line_seen, self._head_size = True, len(line)
            elif line in (b"\r\n", b"\n"):
                self.state = BODY
                self._length = None
            else:
                self._header(line)

    def _request_line(self, line: bytes) -> None:
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(f"malformed request line {line[:100]!r}")
        self.method, self.path = parts[0], parts[1].split("?", 1)[0]

    def _header(self, line: bytes) -> None:
        self._head_size += len(line)
        self._header_count += 1
        if self._head_size > MAX_HEAD or self._header_count > MAX_HEADERS:
            raise BadRequest(f"request head too large: at most {MAX_HEADERS} header lines "
                             f"and {MAX_HEAD} bytes")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise BadRequest(f"malformed header line {line[:100]!r}")
        key, value = name.strip().lower(), value.strip()
        if key in _SINGLE_HEADERS and self.headers.get(key, value) != value:
            raise BadRequest(f"conflicting {name.strip()} headers")
        self.headers[key] = value

    # -- body -------------------------------------------------------------------------------
    def body_length(self, required: bool = True) -> Optional[int]:
        """The declared body size, -1 for chunked; None when there is none (``required``:
        a /cni request must say how long its body is)."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return -1
        header = self.headers.get("content-length")
        if header is None:
            if required:
                raise InvalidEnvironment("the request has no Content-Length")
            return None
        length = _decimal(header)
        if length is None:
            raise DecodeFailure(f"bad Content-Length {header[:40]!r}: it must be a "
                                "non-negative decimal number")
        return length

    def expect_body(self, length: int) -> None:
        """Read a body of ``length`` bytes next (-1: chunked); it is done at once for 0."""
        if length < 0:
            self._chunks = bytearray()
        else:
            self._length = length
        self.parse()

    def _parse_body(self) -> None:
        if self._chunks is not None:
            return self._parse_chunks()
        if self._length is None:
            return  # the head is done; the server has not asked for a body yet
        if len(self.buffer) >= self._length:
            self.body = bytes(self.buffer[:self._length])
            del self.buffer[:]  # whatever follows a Connection: close request is ignored
            self.state = DONE

    def _parse_chunks(self) -> None:
        chunks = self._chunks
        while self.state == BODY:
            if self._chunk_left >= 0:
                if len(self.buffer) < self._chunk_left:
                    return
                chunks += self.buffer[:self._chunk_left]
                del self.buffer[:self._chunk_left]
                self._chunk_left = -2
                continue
            end = self.buffer.find(b"\n", 0, MAX_HEADER_LINE)
            if end < 0:
                if len(self.buffer) >= MAX_HEADER_LINE:
                    raise _bad_chunk_size()
                return
            line = bytes(self.buffer[:end + 1])
            del self.buffer[:end + 1]
            if self._chunk_left == -2:
                if line not in (b"\r\n", b"\n"):
                    raise DecodeFailure("malformed chunked request body: a chunk is longer "
                                        "than its size")
                self._chunk_left = -1
                continue
            if self._chunk_left == -3:  # the line after the last chunk
                self.body = bytes(chunks)
                self.state = DONE
                return
            digits = line.split(b";")[0].strip()
            if not digits or digits.strip(_HEX_DIGITS):
                raise _bad_chunk_size()
            size = int(digits, 16)
            if size == 0:
                self._chunk_left = -3
            elif len(chunks) + size > MAX_BODY:
                raise DecodeFailure(f"request body is over the limit of {MAX_BODY} bytes")
            else:
                self._chunk_left = size

    @property
    def buffered(self) -> int:
        """Bytes this request holds in memory now."""
        return len(self.buffer) + (len(self._chunks) if self._chunks is not None else 0)


# The phases of a connection while the server's reactor owns it.
READING, READY_WAIT, WRITING, LINGER = "reading", "ready-wait", "writing", "linger"


class Connection:
    """A connection while the server's reactor owns it: its request being read, its answer
    being written, its deadlines and the bytes it holds of the server's memory bound."""

    __slots__ = ("sock", "fd", "parser", "phase", "deadline", "read_deadline", "out",
                 "linger", "eof", "charged", "reserved", "metered", "discarded", "events",
                 "serial")

    def __init__(self, sock: socket.socket, now: float, head_timeout: float,
                 read_timeout: float) -> None:
        self.sock, self.fd = sock, sock.fileno()
        self.parser = RequestParser()
        self.phase = READING
        self.read_deadline = now + read_timeout
        self.deadline = now + min(head_timeout, read_timeout)
        self.out = b""
        self.linger = False
        self.eof = False
        self.charged = 0  # bytes of the memory bound this connection holds
        self.reserved = 0  # of those, a declared body's bytes charged before they came
        self.metered = False  # a chunked CNI body: refused once the bound is passed
        self.discarded = 0
        self.events = selectors.EVENT_READ
        self.serial = -1

    @property
    def idle(self) -> bool:
        """Nothing of value would be lost by closing it: no request yet, or answered."""
        return self.phase == LINGER or (self.phase == READING
                                         and self.parser.state == HEAD)



def _bad_chunk_size() -> DecodeFailure:
    return DecodeFailure("malformed chunked request body: a chunk size must be hexadecimal "
                         "digits on a line of its own")


def _decimal(text: str) -> Optional[int]:
    """A Content-Length as RFC 9110 has it (digits only: no sign, no spaces); None if not."""
    text = text.strip()
    if not text or len(text) > 18 or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


_ENV_KEYS = (b"CNI_COMMAND", b"CNI_CONTAINERID")
_ENV_VALUE = {key: re.compile(rb'"' + key + rb'"\s*:\s*"([^"\\]{0,256})"') for key in _ENV_KEYS}


def peek_env(body: bytes) -> tuple[str, str]:
    """(CNI_COMMAND, CNI_CONTAINERID) of a /cni or /delegate body, as the request's own
    decoding (``core.request.decode_body``) will read them; "" for what it will not find.

    The lanes run one sandbox's requests one at a time by this container ID (invariant 5), so
    it is the ID the request acts on, whenever it acts on one (a request whose env names none
    is refused, or touches no sandbox). What shims send is read without decoding: each key
    written once, plainly (UTF-8, and no ``\\u`` escape anywhere in the body, so no key is
    spelled otherwise), its value a plain string; any other body is decoded in full.
    """
    if b"\\u" not in body and b"\x00" not in body[:4]:  # not UTF-16/32 (refused when decoded)
        values = []
        for key in _ENV_KEYS:
            count = body.count(key)
            match = _ENV_VALUE[key].search(body) if count == 1 else None
            if count > 1 or (count == 1 and match is None):
                break  # written twice, or its value escaped or long: decode
            values.append(match.group(1).decode("utf-8", "replace") if match else "")
        else:
            return values[0], values[1]
    try:
        env = decode_body(body)[0]
    except MultusError:
        return "", ""  # the request is refused when it is decoded: it touches no sandbox
    found = [env.get(key.decode()) for key in _ENV_KEYS]
    return tuple(value if isinstance(value, str) else "" for value in found)  # type: ignore
