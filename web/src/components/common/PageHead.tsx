// A page's heading row: its title, then (pushed to the right) what the page puts beside it.
import type { ReactNode } from "react";

export function PageHead({ title, children }: { title: ReactNode; children?: ReactNode }) {
  return (
    <div className="page-head">
      <h1>{title}</h1>
      <span className="spacer" />
      {children}
    </div>
  );
}
