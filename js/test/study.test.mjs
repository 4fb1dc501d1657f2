// The TypeScript study at small N against the real refund-service: unprotected agents
// reproduce the duplicate and the omission; every protected cell is exactly once, nothing false.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { test } from "node:test";
import { POLICIES, serviceBinary, study, table } from "../dist-study/refund.js";

const FAULTS = ["pre_effect_disconnect", "post_commit_disconnect"];

test("the refund study through the AI SDK's tool execution, N = 2", async () => {
  const bin = serviceBinary();
  assert.ok(existsSync(bin), `${bin} is missing: cargo build -p once-refund-example, or set ONCE_REFUND_SERVICE`);
  const cells = await study(bin, 2, FAULTS);
  const shown = table(cells, FAULTS);
  const cell = (policy, protectedAgent, fault) => cells.get(`${policy}/${protectedAgent}/${fault}`);
  for (const policy of POLICIES) {
    for (const fault of FAULTS) {
      const c = cell(policy, true, fault);
      assert.equal(c.exactlyOnce, c.trials, `${policy} (once) under ${fault}\n${shown}`);
      assert.equal(c.falseCompletions, 0, shown);
    }
  }
  assert.equal(cell("always_retry", false, "post_commit_disconnect").duplicates, 2, shown);
  assert.equal(cell("never_retry", false, "pre_effect_disconnect").omissions, 2, shown);
  assert.equal(cell("never_retry", false, "post_commit_disconnect").falseCompletions, 2, shown);
});
