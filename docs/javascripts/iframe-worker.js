/* Search on a site opened from the disk (file://). Browsers refuse to start a Web Worker
   from a file, and Material's search runs in one; its offline plugin would fetch a shim from
   unpkg.com, which a reader without a network cannot. Under file:// this one runs the search
   worker's script in a hidden iframe of the same origin instead: messages posted to the
   worker are dispatched on the iframe's window, and what the script posts comes back as
   "message" events. Elsewhere (a server) nothing changes. Written for kvdrift's site. */
(function () {
  "use strict";
  if (location.protocol !== "file:") {
    return;
  }

  function IFrameWorker(url) {
    var worker = this;
    var script = new URL(url, document.baseURI).href;
    var frame = document.createElement("iframe");
    var inbox = [];  // posted before the script has loaded
    var target = null;
    this.onmessage = null;
    this.onerror = null;
    this._listeners = [];

    function deliver(data) {
      var event = { data: data, target: worker, currentTarget: worker, type: "message" };
      if (typeof worker.onmessage === "function") {
        worker.onmessage(event);
      }
      worker._listeners.slice().forEach(function (listener) {
        listener.call(worker, event);
      });
    }

    function dispatch(data) {
      target.dispatchEvent(new target.MessageEvent("message", { data: data }));
    }

    this._send = function (data) {
      if (target === null) {
        inbox.push(data);
      } else {
        dispatch(data);
      }
    };

    frame.setAttribute("aria-hidden", "true");
    frame.setAttribute("tabindex", "-1");
    frame.style.display = "none";
    frame.srcdoc = "<!doctype html><meta charset=\"utf-8\"><title>search</title>";
    frame.addEventListener("load", function () {
      var scope = frame.contentWindow;
      scope.postMessage = function (data) {  // the worker's global postMessage
        setTimeout(function () { deliver(data); }, 0);
      };
      scope.importScripts = function () {
        throw new Error("importScripts is not available to a worker run from a file");
      };
      var tag = scope.document.createElement("script");
      tag.src = script;
      tag.addEventListener("load", function () {
        target = scope;
        inbox.splice(0).forEach(dispatch);
      });
      tag.addEventListener("error", function (error) {
        if (typeof worker.onerror === "function") {
          worker.onerror(error);
        }
      });
      scope.document.head.appendChild(tag);
    }, { once: true });
    (document.body || document.documentElement).appendChild(frame);
    this._frame = frame;
  }

  IFrameWorker.prototype.postMessage = function (data) {
    this._send(data);
  };
  IFrameWorker.prototype.addEventListener = function (type, listener) {
    if (type === "message" && this._listeners.indexOf(listener) < 0) {
      this._listeners.push(listener);
    }
  };
  IFrameWorker.prototype.removeEventListener = function (type, listener) {
    this._listeners = this._listeners.filter(function (l) { return l !== listener; });
  };
  IFrameWorker.prototype.terminate = function () {
    this._frame.remove();
  };

  window.IFrameWorker = IFrameWorker;  // Material's search worker looks for this name
  window.Worker = IFrameWorker;
})();
