// Builds the boards' browser modules (the run's dashboard and the sweep's board, anywidget ES
// modules, src/boards/) into nbdist/notebook/board/static/built/, where board/widget.py reads
// them: each board's code with what it imports (src/boards/, the sidebar's chart, format and
// smoothing modules, uPlot) in one ES module, and its stylesheet (src/style/boards/) with
// uPlot's and the chart's. Nothing is fetched at run time. tsc type-checks the same sources
// (`jlpm build:lib`). Run by `jlpm build` and `jlpm build:prod` (so by `pip install`); `--dev`
// keeps it readable.
import * as esbuild from 'esbuild';
import { dirname, resolve } from 'node:path';
import process from 'node:process';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dev = process.argv.includes('--dev');

await esbuild.build({
  entryPoints: ['dashboard', 'sweep'].flatMap(name => [
    { in: resolve(here, `src/boards/${name}/index.ts`), out: name },
    { in: resolve(here, `src/style/boards/${name}.css`), out: name }
  ]),
  outdir: resolve(here, '../nbdist/notebook/board/static/built'),
  bundle: true,
  format: 'esm',
  target: 'es2020',
  minify: !dev,
  legalComments: 'eof',
  logLevel: 'warning'
});
