// A table in its scrolling wrapper: a caption (for screen readers only, unless it is given a style), a header
// row and the body's rows. Pages' tables share it so that each writes only its own cells.
import type { CSSProperties, ReactNode } from "react";

export function DataTable({
  caption,
  captionStyle,
  head,
  children,
  testId,
  className = "table-wrap",
  style,
}: {
  caption: ReactNode;
  captionStyle?: CSSProperties;
  head: ReactNode;
  children: ReactNode;
  testId?: string;
  className?: string;
  style?: CSSProperties;
}) {
  return (
    <div className={className} style={style}>
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
