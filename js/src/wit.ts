// The component's types, as jco generates them from wit/once.wit (gen/ is built by `npm run build`):
// every value this package exchanges with the component crosses typed, so none is declared by hand.
export type * from "../gen/interfaces/once-core-types.js";
// The witness import's own variant (declared in `interface witness`, not `types`).
export type { Witnessed } from "../gen/interfaces/once-core-witness.js";
