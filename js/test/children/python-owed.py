"""The Python package reading a record another host left owed (js/test/owed.test.mjs).

    python-owed.py LOCATION SCOPE KEY

Prints one JSON line: the record's state and version, and the owed dispatches its sweep lists.
"""

import json
import sys

from once import Once


def main() -> None:
    location, scope, key = sys.argv[1:]
    once = Once.postgres(location) if location.startswith("postgres") else Once.sqlite(location)
    view = once.inspect(scope, key)
    swept = once.sweep()
    print(json.dumps({
        "state": None if view is None else view.state.value,
        "version": None if view is None else view.version,
        "owed": [list(x) for x in swept.owed],
    }))
    once.close()


if __name__ == "__main__":
    main()
