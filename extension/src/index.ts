import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';

import { nbdistIcon } from './icon';
import { RunOpener } from './opener';
// The panel goes into the shell at activation, so it is needed at once: no lazy import.
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { SidebarPanel } from './panel';

/**
 * nbdist's sidebar: clusters, live runs and worker health, in the left area; a run opened from
 * it (or several compared) in the main area.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbdist:sidebar',
  description: 'Clusters, live runs and worker health of nbdist.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    const panel = new SidebarPanel(new RunOpener(app.shell));
    panel.id = 'nbdist-sidebar';
    panel.title.icon = nbdistIcon;
    panel.title.caption = 'nbdist: clusters and runs';
    app.shell.add(panel, 'left', { rank: 600 });
  }
};

export default plugin;
