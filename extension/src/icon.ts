import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="12" cy="4.5" r="2.5"/>
    <circle cx="4.5" cy="18" r="2.5"/>
    <circle cx="19.5" cy="18" r="2.5"/>
    <path d="M11 7h2v4.4l5.2 4.3-1.3 1.5L12 13.1l-4.9 4.1-1.3-1.5L11 11.4z"/>
  </g>
</svg>`;

/** The sidebar's tab icon: three ranks joined in one group. */
export const nbdistIcon = new LabIcon({ name: 'nbdist:cluster', svgstr: svg });
