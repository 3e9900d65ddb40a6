// numfmt_ecmascript.mjs -- reads numfmt_ecmascript's lines "HEXBITS TEXT"
// from standard input and checks each TEXT against String(x), ECMAScript's
// Number.prototype.toString(10), for the double x of those bits.
//
// The input is read in chunks and never held whole: ten million lines are
// some 300 MB. Exits 0 when every line matched and the closing "end COUNT"
// line counted as many; prints the first mismatches otherwise.
const view = new DataView(new ArrayBuffer(8));
let rest = '';
let lines = 0;
let mismatches = 0;
let endCount = -1;

function check(line) {
  if (line.length === 0) return;
  if (line.startsWith('end ')) {
    endCount = Number(line.slice(4));
    return;
  }
  const hex = line.slice(0, 16);
  const text = line.slice(17);
  view.setUint32(0, parseInt(hex.slice(0, 8), 16));
  view.setUint32(4, parseInt(hex.slice(8, 16), 16));
  const want = String(view.getFloat64(0));
  lines++;
  if (want !== text) {
    if (mismatches < 20)
      console.error(`${hex}: idem wrote ${text}, ECMAScript ${want}`);
    mismatches++;
  }
}

process.stdin.setEncoding('latin1');
process.stdin.on('data', (chunk) => {
  const parts = (rest + chunk).split('\n');
  rest = parts.pop();
  for (const line of parts) check(line);
});
process.stdin.on('end', () => {
  check(rest);
  if (endCount !== lines) {
    console.error(`numfmt_ecmascript: read ${lines} lines, the writer ` +
                  `wrote ${endCount}`);
    process.exit(1);
  }
  console.log(`numfmt_ecmascript: ${lines} doubles, ${mismatches} ` +
              'differences from ECMAScript');
  process.exit(mismatches === 0 ? 0 : 1);
});
