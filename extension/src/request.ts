/**
 * The one way the sidebar talks to the server: `requestAPI<T>()` under `/nbdist/api/`.
 *
 * Errors are typed: `Unreachable` when the Jupyter server cannot be reached at all (the panel
 * says so and backs off), `ApiError` when it answered with an error (the message is the
 * server's one-line explanation, shown as text).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The server answered, with an error status. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** The request never got an answer: the server is down or the network is gone. */
export class Unreachable extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'Unreachable';
  }
}

/**
 * Call an nbdist endpoint (`endPoint` is relative to `/nbdist/api/`) and return its JSON.
 */
export async function requestAPI<T>(endPoint = '', init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbdist', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new Unreachable(String(error));
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    if (response.status === 502 || response.status === 503 || response.status === 504) {
      throw new Unreachable(`the server answered ${response.status}`);
    }
    const message = (data && (data.message || data.reason)) || response.statusText;
    throw new ApiError(String(message), response.status);
  }
  return data as T;
}

/** An error as the one line the panel and the run views show. */
export function errorText(error: unknown): string {
  if (error instanceof ApiError || error instanceof Unreachable) {
    return error.message;
  }
  return String(error);
}
