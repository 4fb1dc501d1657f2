// The component's types, as jco generated them from wit/once.wit (gen/ is built by `npm run build`).
export type * from "../gen/interfaces/once-core-types.js";
