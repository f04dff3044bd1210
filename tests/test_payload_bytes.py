"""The queue's bytes are a contract with workers and outboxes already running: these payloads
were encoded by the code before its rewrite, and every later version must write (and read)
exactly the same bytes."""

from __future__ import annotations

import msgpack

from eagle_synth.payload import PromptItem, TaskPayload, pack_item, unpack_item

PLAIN = TaskPayload(
    campaign="c1",
    batch="b1",
    sampling={"temperature": 0.7, "max_new_tokens": 8},
    items=[
        PromptItem(key="k" * 32, row_id="r1", sample=0, ids=[1, 2, 300000], seed=7, source="f.jsonl:1", turn=0),
        PromptItem(key="j" * 32, row_id="r2", sample=1, ids=[5], seed=None, source="f.jsonl:2", turn=1),
    ],
)
EXTENDED = TaskPayload(
    campaign="c2",
    batch="b2",
    sampling={"temperature": 1.0},
    items=[
        PromptItem(
            key="a" * 32,
            row_id="r",
            sample=0,
            ids=[9, 10],
            seed=3,
            source="s:1",
            turn=2,
            conversation={"messages": [{"role": "user", "content": "hi"}], "pending": ["next"]},
            sampling_overrides={"top_p": 0.5},
            variant="v1",
        )
    ],
)
PLAIN_HEX = (
    "8ca17601a863616d706169676ea26331a56261746368a26231a873616d706c696e6782ab74656d7065726174757265cb3fe666666666"
    "6666ae6d61785f6e65775f746f6b656e7308a46b65797392d9206b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b"
    "6b6b6b6bd9206a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6a6aa4726f777392a27231a27232a773616d"
    "706c6573920001a573656564739207c0a7736f757263657392a9662e6a736f6e6c3a31a9662e6a736f6e6c3a32a57475726e73920001"
    "a76c656e67746873920301a3696473c41928b52ffd20108100000100000002000000e093040005000000"
)
EXTENDED_HEX = (
    "8fa17602a863616d706169676ea26332a56261746368a26232a873616d706c696e6781ab74656d7065726174757265cb3ff000000000"
    "0000a46b65797391d9206161616161616161616161616161616161616161616161616161616161616161a4726f777391a172a773616d"
    "706c65739100a573656564739103a7736f757263657391a3733a31a57475726e739102a76c656e677468739102a3696473c41128b52f"
    "fd2008410000090000000a000000ad636f6e766572736174696f6e73c43928b52ffd20308101009182a86d657373616765739182a472"
    "6f6c65a475736572a7636f6e74656e74a26869a770656e64696e6791a46e657874b273616d706c696e675f6f76657272696465739181"
    "a5746f705f70cb3fe0000000000000a876617269616e747391a27631"
)
PACKED_PLAIN_HEX = (
    "97d9206b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6ba2723100c40c0100000002000000e093040007"
    "a9662e6a736f6e6c3a3100"
)
PACKED_EXTENDED_HEX = (
    "98d9206161616161616161616161616161616161616161616161616161616161616161a17200c408090000000a00000003a3733a3102"
    "83ac636f6e766572736174696f6e82a86d657373616765739182a4726f6c65a475736572a7636f6e74656e74a26869a770656e64696e"
    "6791a46e657874b273616d706c696e675f6f766572726964657381a5746f705f70cb3fe0000000000000a776617269616e74a27631"
)


def _bytes(value: object) -> str:
    return msgpack.packb(value, use_bin_type=True).hex()


def test_task_payloads_keep_their_bytes():
    for payload, pinned in ((PLAIN, PLAIN_HEX), (EXTENDED, EXTENDED_HEX)):
        assert _bytes(payload.encode()) == pinned
        decoded = TaskPayload.decode(msgpack.unpackb(bytes.fromhex(pinned), raw=False))
        assert decoded == payload


def test_packed_items_keep_their_bytes():
    for item, pinned in ((PLAIN.items[0], PACKED_PLAIN_HEX), (EXTENDED.items[0], PACKED_EXTENDED_HEX)):
        assert _bytes(pack_item(item)) == pinned
        assert unpack_item(msgpack.unpackb(bytes.fromhex(pinned), raw=False)) == item
