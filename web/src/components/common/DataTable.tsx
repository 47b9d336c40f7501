// A table in its scrolling wrapper: a caption (for screen readers only, unless it is given a style), a header
// row and the body's rows; `panel`: on a panel of its own, edge to edge. Pages' tables share it so that each
// writes only its own cells.
import type { CSSProperties, ReactNode } from "react";

export function DataTable({
  caption,
  captionStyle,
  head,
  children,
  testId,
  panel = false,
  style,
}: {
  caption: ReactNode;
  captionStyle?: CSSProperties;
  head: ReactNode;
  children: ReactNode;
  testId?: string;
  panel?: boolean;
  style?: CSSProperties;
}) {
  return (
    <div className={panel ? "panel table-wrap" : "table-wrap"} style={panel ? { padding: 0, ...style } : style}>
      <table data-testid={testId}>
        <caption className={captionStyle ? undefined : "sr-only"} style={captionStyle}>
          {caption}
        </caption>
        <thead>
          <tr>{head}</tr>
        </thead>
        <tbody>{children}</tbody>
      </table>
    </div>
  );
}
