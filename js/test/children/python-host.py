"""The Python package as the third host of a ledger the Node tests share (js/test/hosts.test.mjs).

    python-host.py LOCATION SCOPE KEY ARGS_JSON ACTION [RECEIPT_JSON]

ACTION `confirm` sends and answers RECEIPT_JSON; `lose` sends and raises (the reply is lost);
`replay` must not send (its send answers a receipt that would show if it did). Prints one JSON
line: how the call ended, its receipt, whether it replayed, how many sends it made, and the
provider key its first send carried.
"""

import json
import sys

from once import Once


def main() -> None:
    location, scope, key, args, action, *rest = sys.argv[1:]
    once = Once.postgres(location) if location.startswith("postgres") else Once.sqlite(location)
    sends = []

    def send(dispatch: object) -> object:
        sends.append(dispatch)
        if action == "lose":
            raise ConnectionResetError("connection reset after the request was sent")
        return json.loads(rest[0]) if action == "confirm" else {"refund_id": "SENT-BY-A-REPLAY"}

    called = once.call(scope, key, "refund_order", args, send)
    ending = called.ending
    print(json.dumps({
        "ending": type(ending).__name__,
        "receipt": called.receipt,
        "replayed": getattr(ending, "replayed", None),
        "sends": len(sends),
        # The provider key the first send carried (none without a send): js/test/hosts.test.mjs
        # checks it was derived with the ledger's secret, as Node's are.
        "provider_key": getattr(sends[0], "provider_key", None) if sends else None,
    }))
    once.close()


if __name__ == "__main__":
    main()
