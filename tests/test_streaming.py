"""Chunked transfers: sizes enforced before buffering, resumable after a break."""

import hashlib

import pytest

from protocol.wire import swarm_pb2
from protocol.channels import CHUNK_BYTES
from protocol.streaming import TransferError, iter_chunks, receive_chunks

DATA = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 10)  # a bit over 2 chunks


def test_roundtrip_in_bounded_chunks():
    chunks = list(iter_chunks(DATA))
    assert len(chunks) == 3 and all(len(c.data) <= CHUNK_BYTES for c in chunks)
    data, first = receive_chunks(chunks, max_size=len(DATA), expected_size=len(DATA))
    assert data == DATA and first.sha256 == hashlib.sha256(DATA).hexdigest()


def test_declared_size_over_limit_refused_before_reading():
    with pytest.raises(TransferError, match="limit"):
        receive_chunks(iter_chunks(DATA), max_size=len(DATA) - 1)


def test_sender_exceeding_its_declaration_is_cut_off():
    chunks = list(iter_chunks(DATA))
    chunks.append(swarm_pb2.Chunk(data=b"x", offset=len(DATA), total_size=len(DATA), sha256=chunks[0].sha256))
    with pytest.raises(TransferError, match="more bytes"):
        receive_chunks(chunks, max_size=10 * len(DATA))


def test_broken_stream_resumes_from_valid_prefix():
    def broken():
        for i, chunk in enumerate(iter_chunks(DATA)):
            if i == 2:
                raise ConnectionResetError("link dropped")
            yield chunk

    with pytest.raises(TransferError) as err:
        receive_chunks(broken(), max_size=len(DATA))
    prefix = err.value.received
    assert len(prefix) == 2 * CHUNK_BYTES and DATA.startswith(prefix)
    data, _ = receive_chunks(iter_chunks(DATA, offset=len(prefix)), max_size=len(DATA), prefix=prefix)
    assert data == DATA


def test_corrupted_data_fails_hash():
    chunks = list(iter_chunks(DATA))
    chunks[1] = swarm_pb2.Chunk(data=b"\x00" * len(chunks[1].data), offset=chunks[1].offset,
                                total_size=chunks[1].total_size, sha256=chunks[1].sha256)
    with pytest.raises(TransferError, match="sha256"):
        receive_chunks(chunks, max_size=len(DATA))
