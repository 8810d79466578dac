"""The harness's self-tests: broken runtimes the suites must catch, and the plugin's own behaviour."""
