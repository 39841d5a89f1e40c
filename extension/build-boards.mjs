// Builds the boards' browser modules (the run's dashboard and the sweep's board, anywidget ES
// modules) into nbdist/notebook/board/static/built/: each board's code with what it imports
// (static/common.js; src/chart.ts and src/format.ts, shared with the sidebar; uPlot) in one ES
// module, and its stylesheet with uPlot's and the chart's. Nothing is fetched at run time.
// Run by `jlpm build` and `jlpm build:prod` (so by `pip install`); `--dev` keeps it readable.
import * as esbuild from 'esbuild';
import { dirname, resolve } from 'node:path';
import process from 'node:process';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const boards = resolve(here, '../nbdist/notebook/board/static');
const dev = process.argv.includes('--dev');

await esbuild.build({
  entryPoints: ['dashboard', 'sweep'].flatMap(name => [
    { in: resolve(boards, `${name}.js`), out: name },
    { in: resolve(boards, `${name}.css`), out: name }
  ]),
  outdir: resolve(boards, 'built'),
  bundle: true,
  format: 'esm',
  target: 'es2020',
  minify: !dev,
  legalComments: 'eof',
  logLevel: 'warning',
  // The boards live in the Python package, beside their widgets; what they import lives here.
  nodePaths: [resolve(here, 'node_modules')],
  alias: {
    '@nbdist/chart': resolve(here, 'src/chart.ts'),
    '@nbdist/format': resolve(here, 'src/format.ts'),
    '@nbdist/chart.css': resolve(here, 'src/style/chart.css')
  }
});
