"""multusd.daemon.httpreq: a request parsed from bytes as they arrive, refusals that say why."""

import pytest

from multusd.core import request
from multusd.daemon import httpreq
from multusd.errors import DecodeFailure, InvalidEnvironment

BODY = b'{"env": {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1"}, "config": "e30="}'
REQUEST = (b"POST /cni?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(BODY)
           + BODY)


def parse(data: bytes, step: int = 0) -> httpreq.RequestParser:
    """Feed ``data`` (``step`` bytes at a time, or at once); read a body when the head says."""
    parser = httpreq.RequestParser()
    for start in range(0, len(data), step or len(data)):
        parser.feed(data[start:start + (step or len(data))])
        before = parser.state
        if parser.parse() != httpreq.HEAD and before == httpreq.HEAD:
            length = parser.body_length(required=False)
            parser.expect_body(length or 0)
    return parser


@pytest.mark.parametrize("step", [0, 1, 7])
def test_a_request_parses_the_same_however_its_bytes_arrive(step):
    parser = parse(REQUEST, step)
    assert parser.state == httpreq.DONE
    assert (parser.method, parser.path, parser.body) == ("POST", "/cni", BODY)
    assert parser.headers["host"] == "x"


@pytest.mark.parametrize("step", [0, 3])
def test_a_chunked_body(step):
    data = (b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n")
    parser = parse(data, step)
    assert parser.state == httpreq.DONE and parser.body == b"hello world"


def test_the_head_waits_for_its_blank_line():
    parser = parse(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    assert parser.state == httpreq.HEAD
    with pytest.raises(httpreq.BadRequest, match="ended before its blank line"):
        parser.at_eof()


def test_nothing_sent_is_no_error():
    httpreq.RequestParser().at_eof()


@pytest.mark.parametrize("data,message", [
    (b"GARBAGE\r\n\r\n", "malformed request line"),
    (b"GET / SPDY/3\r\n\r\n", "malformed request line"),
    (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", "malformed header line"),
    (b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n", "request head too large"),
    (b"GET / HTTP/1.1\r\nX: " + b"y" * 70000, "header line too long"),
    (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "conflicting"),
])
def test_malformed_heads_say_what_is_wrong(data, message):
    with pytest.raises(httpreq.BadRequest, match=message):
        parse(data)


@pytest.mark.parametrize("length", ["-1", "+5", "12abc", " ", "0x10", "9" * 19])
def test_a_content_length_is_decimal_digits_only(length):
    parser = httpreq.RequestParser()
    parser.feed(f"POST /cni HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode())
    assert parser.parse() == httpreq.BODY
    with pytest.raises(DecodeFailure, match="bad Content-Length"):
        parser.body_length()


def test_a_cni_request_must_say_how_long_its_body_is():
    parser = httpreq.RequestParser()
    parser.feed(b"POST /cni HTTP/1.1\r\n\r\n")
    parser.parse()
    with pytest.raises(InvalidEnvironment, match="no Content-Length"):
        parser.body_length()
    assert parser.body_length(required=False) is None


@pytest.mark.parametrize("chunks,message", [
    (b"-1\r\n", "hexadecimal digits"), (b"0x5\r\n", "hexadecimal digits"),
    (b"3\r\nabcdef\r\n", "longer than its size"), (b"%x\r\n" % (httpreq.MAX_BODY + 1),
                                                   "over the limit")])
def test_chunked_framing_errors(chunks, message):
    with pytest.raises(DecodeFailure, match=message):
        parse(b"POST /cni HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)


def test_a_body_cut_short_is_refused_at_eof():
    parser = parse(REQUEST[:-5])
    assert parser.state == httpreq.BODY
    with pytest.raises(DecodeFailure, match=f"after {len(BODY) - 5} of its {len(BODY)} bytes"):
        parser.at_eof()


def test_peek_env_reads_the_command_and_container_id_in_either_spelling():
    assert httpreq.peek_env(BODY) == ("DEL", "c1")
    assert httpreq.peek_env(b'{"env":{"CNI_CONTAINERID":"x","CNI_COMMAND":"ADD"}}') == ("ADD", "x")
    assert httpreq.peek_env(b"not json at all") == ("", "")


CONFIG = b'"config": "e30="'
ODD_BODIES = {
    "key spelled with an escape":
        rb'{"env": {"CNI_COMMAND": "ADD", "CNI\u005fCONTAINERID": "c1"}, ' + CONFIG + b"}",
    "value spelled with an escape":
        rb'{"env": {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c\u0031"}, ' + CONFIG + b"}",
    "written twice (the last one counts)":
        b'{"env": {"CNI_CONTAINERID": "c1", "CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c2"}, '
        + CONFIG + b"}",
    "a decoy before env": b'{"interfaceAttributes": {"CNI_CONTAINERID": "decoy"}, '
                          b'"env": {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1"}, '
                          + CONFIG + b"}",
    "an ID too long to peek":
        b'{"env": {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "' + b"c" * 300 + b'"}, '
        + CONFIG + b"}",
    "only a decoy": b'{"env": {"CNI_COMMAND": "ADD"}, "x": {"CNI_CONTAINERID": "decoy"}, '
                    + CONFIG + b"}",
    "UTF-16": ('{"env": {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1"}, "config": "e30="}'
               .encode("utf-16")),
    "env not an object": b'{"env": ["CNI_CONTAINERID"], ' + CONFIG + b"}",
    "nested too deep": b"[" * 100000 + b"]" * 100000,
    "plain": BODY,
}


@pytest.mark.parametrize("body", ODD_BODIES.values(), ids=ODD_BODIES.keys())
def test_peek_env_finds_the_container_id_the_request_will_act_on(body):
    """The lanes run a sandbox's requests one at a time by this ID: it must be the one the
    request's own decoding reads, whenever that names one (else the request is refused or
    touches no sandbox: any ID only serialises it needlessly)."""
    try:
        env = request.decode_body(body)[0]
    except (DecodeFailure, RecursionError):
        env = {}
    command, container_id = httpreq.peek_env(body)
    assert command == env.get("CNI_COMMAND", "")
    if "CNI_CONTAINERID" in env:
        assert container_id == env["CNI_CONTAINERID"]


def test_an_answer_is_one_buffer_that_closes_the_connection():
    assert httpreq.response(404, b"") == (b"HTTP/1.1 404 Not Found\r\nContent-Type: "
                                          b"application/json\r\nContent-Length: 0\r\n"
                                          b"Connection: close\r\n\r\n")
